"""A node's data endpoint in a process of its own, as the peer a recovering node reads from: its
threads do not share the loading process's interpreter (on a cluster they are on another
machine). Prints its URL as JSON, serves until its stdin closes.

    python -m benchmarks.scenarios.recovery_child NODE   # settings from TIERPOINT_* variables
"""

from __future__ import annotations

import json
import sys

from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import serve


def main(node: str) -> None:
    settings = Settings()
    engine = make_sync_engine(settings.database_url, pool_size=4)
    server = serve(settings, sync_sessions(engine), node, 0)
    print(json.dumps({"url": server.url}), flush=True)
    sys.stdin.read()
    server.shutdown()
    server.server_close()
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
