"""A node's data endpoint in a process of its own, as the peer a recovering node reads from: its
threads do not share the loading process's interpreter (on a cluster they are on another
machine). Prints its URL as JSON, serves until its stdin closes.

    python -m benchmarks.scenarios.recovery_child NODE   # settings from TIERPOINT_* variables
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve


class Endpoint:
    """A node's data endpoint with its own catalog engine."""

    def __init__(self, settings: Settings, node: str) -> None:
        self.engine = make_sync_engine(settings.database_url, pool_size=4)
        self.server: DataServer = serve(settings, sync_sessions(self.engine), node, 0)
        self.url = self.server.url

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.engine.dispose()


def serve_node(variables: Mapping[str, str], node: str) -> Endpoint:
    """`node`'s endpoint in this process, with the settings the TIERPOINT_* `variables` give."""
    return Endpoint(
        Settings(
            database_url=variables["TIERPOINT_DATABASE_URL"],
            tiers=json.loads(variables["TIERPOINT_TIERS"]),
            data_token=variables["TIERPOINT_DATA_TOKEN"],
        ),
        node,
    )


def main(node: str) -> None:
    endpoint = Endpoint(Settings(), node)
    print(json.dumps({"url": endpoint.url}), flush=True)
    sys.stdin.read()
    endpoint.close()


if __name__ == "__main__":
    main(sys.argv[1])
