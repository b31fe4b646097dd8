"""DCP storage for tierpoint (`pip install 'tierpoint-client[torch]'`).

dcp.save(state, storage_writer=TierpointWriter(job, step))
dcp.load(state, storage_reader=TierpointReader(job))
"""

try:
    import torch.distributed.checkpoint  # noqa: F401
except ImportError as e:
    from tierpoint_client.errors import MissingDependencyError

    raise MissingDependencyError(
        "tierpoint_client.torch needs torch (and numpy): pip install 'tierpoint-client[torch]'"
    ) from e

from tierpoint_client.errors import NoVerifiedCopyError
from tierpoint_client.torch._copies import ReadStats
from tierpoint_client.torch._files import NODE_ENV, TierpointStorageInfo
from tierpoint_client.torch.reader import TierpointReader
from tierpoint_client.torch.writer import TierpointWriter

__all__ = [
    "NODE_ENV",
    "NoVerifiedCopyError",
    "ReadStats",
    "TierpointReader",
    "TierpointStorageInfo",
    "TierpointWriter",
]
