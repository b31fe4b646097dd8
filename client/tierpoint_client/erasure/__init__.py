"""Erasure coding for a peer tier that keeps stripes instead of copies (`code = "rs(k,m)"`).

code: the code, parsed and validated in one place; stripes: the stripe format and the streaming
encode and decode, every stripe and the whole file checked by crc32c; files: the same over files,
written atomically, a corrupt stripe left out and the file decoded from the others; fetch: a
file restored from stripes wherever they are held, any k read in parallel, data stripes first;
join: a file from its k data stripes alone, each stripe's payloads straight to their place.
"""

from .code import MAX_WIDTH, Code, InvalidCodeError, parse_code
from .fetch import StripeRef, rebuild_stripe, restore_file
from .files import Decoded, NotEnoughStripesError, StripeFile, decode_path, encode_path
from .stripes import (
    SEGMENT_BYTES,
    FileMismatchError,
    StripeCorruptError,
    StripeInfo,
    stripe_size,
)

__all__ = [
    "MAX_WIDTH",
    "SEGMENT_BYTES",
    "Code",
    "Decoded",
    "FileMismatchError",
    "InvalidCodeError",
    "NotEnoughStripesError",
    "StripeCorruptError",
    "StripeFile",
    "StripeInfo",
    "StripeRef",
    "decode_path",
    "encode_path",
    "parse_code",
    "rebuild_stripe",
    "restore_file",
    "stripe_size",
]
