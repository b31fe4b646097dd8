"""The code of an erasure-coded peer tier, `rs(k,m)`: parsed and validated here and nowhere else.

k data stripes and m parity stripes of each file, on k+m nodes; any k of them give the file back,
so a set survives the loss of any m of its holders, at (k+m)/k of the file's bytes in all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import TierpointError

# liberasurecode's limit on fragments per stripe set is higher; beyond 32 holders a set spans so
# many nodes that a lost node touches most sets and a restore fans out to more peers than it
# gains from (ISA-L's Vandermonde matrix is also only guaranteed invertible for small k+m).
MAX_WIDTH = 32

_FORM = re.compile(r"rs\(\s*(\d+)\s*,\s*(\d+)\s*\)")


class InvalidCodeError(TierpointError, ValueError):
    """A code that is not `rs(k,m)` with k >= 2, m >= 1 and k+m <= 32."""


@dataclass(frozen=True)
class Code:
    """Reed-Solomon over k data and m parity stripes (`rs(k,m)`)."""

    k: int
    m: int

    def __post_init__(self) -> None:
        if self.k < 2:
            raise InvalidCodeError(
                f"rs({self.k},{self.m}): k must be at least 2 (one data stripe is a whole copy: "
                "use copies instead)"
            )
        if self.m < 1:
            raise InvalidCodeError(
                f"rs({self.k},{self.m}): m must be at least 1 (with no parity stripe a lost "
                "holder loses the file)"
            )
        if self.k + self.m > MAX_WIDTH:
            raise InvalidCodeError(
                f"rs({self.k},{self.m}): k+m must be at most {MAX_WIDTH} stripes per set"
            )

    @property
    def width(self) -> int:
        """Stripes per file: the nodes holding one set."""
        return self.k + self.m

    def __str__(self) -> str:
        return f"rs({self.k},{self.m})"


def parse_code(text: str) -> Code:
    """`"rs(8,2)"` as a Code; anything else is an InvalidCodeError that says what is wrong."""
    match = _FORM.fullmatch(text.strip())
    if match is None:
        raise InvalidCodeError(
            f"code {text!r} is not of the form rs(k,m), e.g. rs(8,2): k data and m parity stripes"
        )
    return Code(int(match.group(1)), int(match.group(2)))
