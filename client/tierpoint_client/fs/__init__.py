"""The `tierpoint://` fsspec filesystem (`pip install 'tierpoint-client[torch]'`), registered
under fsspec's `fsspec.specs` entry point, so every process knows the protocol without importing
anything (torchrun's ranks, DCP's background save process):

    dcp.save(state, checkpoint_id="tierpoint://llama3-70b.run-7/step-900")
    torchtitan ... --checkpoint.folder tierpoint://llama3-70b.run-7

Configuration comes from the environment: TIERPOINT_API_URL, TIERPOINT_TOKEN, TIERPOINT_NODE, or
fsspec's FSSPEC_TIERPOINT_<KEY> (api_url, token, node, lease_ttl).
"""

from tierpoint_client.fs.filesystem import TierpointFileSystem

__all__ = ["TierpointFileSystem"]
