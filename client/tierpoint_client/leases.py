"""A restore's hold on its checkpoint: one restore lease, renewed while the restore runs and
released when it ends, however it ends, so that retention cannot expire the copies it reads."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import warnings
from collections.abc import Iterator

from tierpoint_client.api import Api
from tierpoint_client.errors import ConflictError, TierpointError
from tierpoint_client.models import Lease

# A restore's lease lasts this long past its last renewal (one every third of it): a restore
# killed outright keeps its checkpoint from expiring for at most this long.
RESTORE_LEASE_TTL = 300


def owner() -> str:
    """Who holds a restore's lease, as operators see it in the checkpoint's leases."""
    return f"restore on {socket.gethostname()} pid {os.getpid()}"[:256]


class _Keeper:
    """Renews the lease every third of its ttl from a thread of its own; a lease that ended
    meanwhile (the process stood still for longer than its ttl) is taken again. Failures are
    warnings, not errors: a restore verifies every byte it reads whether or not it holds a lease,
    and a copy that retention removed is read from the next."""

    def __init__(self, api: Api, lease: Lease, ttl: int) -> None:
        self.api = api
        self.lease = lease
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"tierpoint-lease-{lease.id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # A period, not a deadline: a renewal that comes late still comes a third of a ttl early.
        while not self._stop.wait(max(self.ttl / 3, 1.0)):
            lease = self.lease
            try:
                self.lease = self.api.renew_lease(lease.job, lease.step, lease.id, self.ttl)
            except ConflictError:
                if not self._stop.is_set():  # not one released as the restore ended
                    self._retake()
            except TierpointError as e:
                _warn(f"could not renew restore lease {lease.id} on {lease.job}/{lease.step}: {e}")

    def _retake(self) -> None:
        lease = self.lease
        try:
            self.lease = self.api.create_lease(lease.job, lease.step, self.ttl, lease.owner)
        except TierpointError as e:
            _warn(
                f"restore lease {lease.id} on {lease.job}/{lease.step} ended and no new one could "
                f"be taken ({e}); the restore goes on without one"
            )


@contextlib.contextmanager
def held(api: Api, lease: Lease, ttl: int) -> Iterator[None]:
    """Keep `lease` for the block, then release it (on an error and on Ctrl-C too)."""
    keeper = _Keeper(api, lease, ttl)
    keeper.start()
    try:
        yield
    finally:
        keeper.stop()
        last = keeper.lease
        try:
            api.release_lease(last.job, last.step, last.id)
        except TierpointError as e:
            _warn(
                f"could not release restore lease {last.id} on {last.job}/{last.step} ({e}); "
                f"it ends by itself at most {ttl} s after its last renewal"
            )


def _warn(message: str) -> None:
    warnings.warn(f"tierpoint: {message}", stacklevel=2)
