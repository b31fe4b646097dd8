"""Objects that live as long as a server process, kept out of the cycle collector's way."""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """What exists once a server is built (the modules, their schemas, the app) lives as long as
    the process: frozen, it is no longer walked by every full collection, which a large request
    triggers (a 10,000-shard manifest allocates ~50,000 objects). Called by the commands that
    serve, never by the app, so that processes creating many apps (tests) do not pin each one's
    garbage."""
    gc.collect()
    gc.freeze()
