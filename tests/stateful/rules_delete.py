"""The rule of the stateful machine that deletes a step and has the job write it again: an admin
deletes it (with or without force), the job writes the same paths with new bytes at once (as a
DCP writer does: a temporary name, then a rename) and retries its registration on 409
`checkpoint_being_deleted` until it is accepted, as docs/api.md tells it to.

Until the registration is accepted the new files are nobody's: the old checkpoint's delete must
leave them as they are (it checked the identity of what it verified); once accepted they are the
step's, and the checks after every step hold the store to them."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.stateful import checks
from tests.stateful.model import LOCAL, ShardModel, StepModel
from tests.stateful.rules_data import DataRules
from tests.stateful.stack import SETTLE_TIMEOUT, code

RETRY_PAUSE = 0.2


class DeleteRules(DataRules):
    def write_again(self, step: int, shards: dict[str, ShardModel]) -> None:
        """The job's files of `step`, each under a temporary name and renamed into place."""
        for path, sh in shards.items():
            final = self.stack.step_dir(LOCAL, sh.node, self.model.job, step).joinpath(
                *path.split("/")
            )
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(sh.data)
            os.replace(tmp, final)

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), force=st.booleans(), same_size=st.booleans())
    def delete_and_register_again(self, pick: int, force: bool, same_size: bool) -> None:
        m = self.model
        sm = self.pick(pick)
        assert sm is not None
        before = self.fingerprint()
        params = {"force": "true"} if force else None
        r = self.call("DELETE", self.cp_path(sm.step), "admin", params=params)
        if r.status_code == 409:
            # Pinned, leased or still copying: only with force.
            assert not force and code(r) == "checkpoint_protected", r.text
            assert self.fingerprint() == before, "a refused delete changed something"
            m.count("delete refused: protected")
            return
        assert r.status_code == 202, r.text
        # Latest stops offering it at once (the checks after this step hold the store to that).
        del m.steps[sm.step]
        live = m.live_writers()
        shards = {
            path: ShardModel(
                old.node if old.node in live else live[0],
                os.urandom(len(old.data) if same_size else 1 + len(old.data) % 4096),
            )
            for path, old in sm.shards.items()
        }
        self.write_again(sm.step, shards)
        keys: dict[tuple[str, str | None, str, int, str], bytes] = {
            (LOCAL, s.node, m.job, sm.step, p): s.data for p, s in shards.items()
        }
        m.unregistered.update(keys)
        refused = self.register_until_accepted(sm.step, shards)
        for key in keys:
            del m.unregistered[key]
        m.steps[sm.step] = StepModel(sm.step, shards, lossy=m.policy_is_lossy())
        m.count("delete and register again" + (" (refused first)" if refused else ""))

    def register_until_accepted(self, step: int, shards: dict[str, ShardModel]) -> int:
        """POST until 201, each 409 `checkpoint_being_deleted` followed by a check that the
        delete left the job's new files (and every other unregistered file) alone; how many
        refusals."""
        m = self.model
        manifest: dict[str, Any] = {
            "step": step,
            "shards": [
                {"path": p, "size": len(s.data), "crc32c": s.crc, "node": s.node}
                for p, s in shards.items()
            ],
            "metadata": {"by": "stateful", "written": "again"},
        }
        deadline = time.monotonic() + SETTLE_TIMEOUT
        refused = 0
        while True:
            r = self.call("POST", f"/v1/jobs/{m.job}/checkpoints", "train", json=manifest)
            if r.status_code == 201:
                return refused
            assert r.status_code == 409 and code(r) == "checkpoint_being_deleted", r.text
            refused += 1
            checks.check_unregistered(self.stack, self.engine, m)
            assert time.monotonic() < deadline, f"step {step} never registered again: {r.text}"
            time.sleep(RETRY_PAUSE)
