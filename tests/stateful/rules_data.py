"""Rules of the stateful machine that touch bytes: registering checkpoints (good manifests with
odd names and unregistered files beside them, hostile ones), files put on a tier behind the
store's back, a byte flipped, a file truncated or an object deleted on a tier, a writer lost."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from tests.stateful.base import MachineBase
from tests.stateful.model import (
    LOCAL,
    NAMES,
    ON_NODES,
    PEER,
    PEER2,
    PEERS,
    S3,
    SHARED,
    TIERS,
    ShardModel,
    StepModel,
    crc_hex,
)

MANIFESTS: dict[str, st.SearchStrategy[Any]] = {
    "names": st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
    "sizes": st.lists(st.integers(1, 4096), min_size=3, max_size=3),
    "on_b": st.lists(st.booleans(), min_size=3, max_size=3),
    "null_crc": st.booleans(),
    "extras": st.integers(0, 2),
    "symlink_extra": st.booleans(),
    # The job sends the same registration again (a retry after a lost answer): 200, nothing new.
    "again": st.booleans(),
}
F = TypeVar("F", bound=Callable[..., None])
# One set of strategies for the three registration rules (dict unpacking defeats the stubs).
MANIFEST_RULE: Callable[[F], F] = rule(**MANIFESTS)  # type: ignore[call-overload]
MANIFEST_INIT: Callable[[F], F] = initialize(**MANIFESTS)  # type: ignore[call-overload]
HOSTILE = (
    "traversal",
    "absolute",
    "duplicate",
    "nul",
    "unknown-node",
    "symlink-shard",
    "no-token",
    "read-token",
    "foreign-token",
    "overlap",
    "duplicate-keys",
)
VICTIM = "secret.bin"
# Names nothing treats specially: never a reason to refuse a manifest.
PLAIN = frozenset({"a.bin", "w.bin", "model/rank0.safetensors", "deep/er/nest.bin"})


class DataRules(MachineBase):
    def shard_node(self, on_b: bool) -> str:
        live = self.model.live_writers()
        return live[-1] if on_b else live[0]

    def victim(self) -> tuple[Path, bytes]:
        """A file of another job on the same local tier (what a symlink must never reach)."""
        node = self.model.nodes[0]
        f = self.stack.step_dir(LOCAL, node, self.model.victim_job, 1) / VICTIM
        if not f.exists():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(os.urandom(300))
            key = (LOCAL, node, self.model.victim_job, 1, VICTIM)
            self.model.unregistered[key] = f.read_bytes()
        return f, f.read_bytes()

    def put_unregistered(
        self, tier: str, node: str | None, step: int, path: str, data: bytes
    ) -> None:
        self.stack.write(tier, node, self.model.job, step, path, data)
        self.model.unregistered[(tier, node, self.model.job, step, path)] = data

    @MANIFEST_INIT
    def first_checkpoint(self, **manifest: Any) -> None:
        """Every example starts with a registration, so the other rules have something to act on."""
        self.register(**manifest)

    @MANIFEST_RULE
    def register_another(self, **manifest: Any) -> None:
        # A second rule for the same action: registrations are drawn twice as often.
        self.register(**manifest)

    @MANIFEST_RULE
    def register(
        self,
        names: list[str],
        sizes: list[int],
        on_b: list[bool],
        null_crc: bool,
        extras: int,
        symlink_extra: bool,
        again: bool = False,
    ) -> None:
        m = self.model
        step = m.take_step()
        shards = {
            n: ShardModel(self.shard_node(b), os.urandom(s))
            for n, s, b in zip(names, sizes, on_b, strict=False)
        }
        for path, sh in shards.items():
            self.stack.write(LOCAL, sh.node, m.job, step, path, sh.data)
        node = m.nodes[0]
        for i in range(extras):
            self.put_unregistered(
                LOCAL, node, step, f"UNREGISTERED-{i}/optimizer.pt", os.urandom(64)
            )
        if symlink_extra:
            target, data = self.victim()
            link = self.stack.step_dir(LOCAL, node, m.job, step) / "link-out"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(target, link.parent))
            m.unregistered[(LOCAL, node, m.job, step, "link-out")] = data
        manifest = {
            "step": step,
            "shards": [
                {
                    "path": p,
                    "size": len(s.data),
                    "crc32c": None if null_crc else s.crc,
                    "node": s.node,
                }
                for p, s in shards.items()
            ],
            "metadata": {"by": "stateful"},
        }
        r = self.call("POST", f"/v1/jobs/{m.job}/checkpoints", "train", json=manifest)
        if r.status_code == 422 and set(names) - PLAIN:
            # A name the store cannot carry end to end may be refused, with nothing kept.
            m.count("register: odd name refused")
            for path, sh in shards.items():
                m.unregistered[(LOCAL, sh.node, m.job, step, path)] = sh.data
            return
        assert r.status_code == 201, r.text
        m.steps[step] = StepModel(
            step, shards, lossy=m.policy_is_lossy(), crc_registered=not null_crc
        )
        m.count("register")
        if again:
            before = self.fingerprint()
            r = self.call("POST", f"/v1/jobs/{m.job}/checkpoints", "train", json=manifest)
            assert r.status_code == 200, f"the same registration again: {r.status_code} {r.text}"
            assert self.fingerprint() == before, "the same registration again changed something"
            m.count("register: the same again")

    @rule(kind=st.sampled_from(HOSTILE))
    def register_hostile(self, kind: str) -> None:
        """A manifest (or a request) the store must refuse, changing nothing."""
        m = self.model
        step = m.take_step()
        node = m.nodes[0]
        data = os.urandom(100)
        good = {"path": "a.bin", "size": len(data), "crc32c": crc_hex(data), "node": node}
        self.put_unregistered(LOCAL, node, step, "a.bin", data)
        shards: list[dict[str, Any]] = [good]
        scope, body = "train", None
        if kind == "traversal":
            shards = [{**good, "path": f"../../{m.victim_job}/1/{VICTIM}"}]
        elif kind == "absolute":
            shards = [{**good, "path": "/etc/passwd"}]
        elif kind == "duplicate":
            shards = [good, good]
        elif kind == "nul":
            shards = [{**good, "path": "a\u0000.bin"}]
        elif kind == "unknown-node":
            shards = [{**good, "node": "sf-nowhere"}]
        elif kind == "symlink-shard":
            self.register_symlink(step)
            return
        elif kind in ("no-token", "read-token", "foreign-token"):
            scope = {"no-token": "none", "read-token": "read", "foreign-token": "foreign"}[kind]
        elif kind == "overlap":
            shards = [good, {**good, "path": "a.bin/b"}]
        elif kind == "duplicate-keys":
            raw = json.dumps({"step": step, "shards": shards, "metadata": {}})
            body = raw[:-1] + f', "step": {step + 1000}}}'
        manifest = {"step": step, "shards": shards, "metadata": {}}
        before = self.fingerprint()
        path = f"/v1/jobs/{m.job}/checkpoints"
        if body is not None:
            r = self.call("POST", path, scope, content=body.encode())
        else:
            r = self.call("POST", path, scope, json=manifest)
        assert 400 <= r.status_code < 500, f"hostile registration ({kind}) accepted: {r.text}"
        assert self.checkpoint(step) is None and self.fingerprint() == before, kind
        m.count(f"hostile: {kind}")

    def register_symlink(self, step: int) -> None:
        """A shard that is a symlink out of its step directory, to another job's file."""
        m = self.model
        target, data = self.victim()
        link = self.stack.step_dir(LOCAL, m.nodes[0], m.job, step) / "stolen.bin"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))
        shard = {
            "path": "stolen.bin",
            "size": len(data),
            "crc32c": crc_hex(data),
            "node": m.nodes[0],
        }
        r = self.call(
            "POST",
            f"/v1/jobs/{m.job}/checkpoints",
            "train",
            json={"step": step, "shards": [shard], "metadata": {}},
        )
        if r.status_code >= 400:
            m.count("hostile: symlink-shard refused")
            return
        assert r.status_code == 201, r.text
        sm = StepModel(step, {"stolen.bin": ShardModel(m.nodes[0], data)}, escaped=True)
        m.steps[step] = sm
        m.count("hostile: symlink-shard accepted")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), tier=st.sampled_from(TIERS))
    def extra_file(self, pick: int, tier: str) -> None:
        """A file nobody registers in a checkpoint's directory (or S3 prefix) on a tier."""
        sm = self.pick(pick)
        assert sm is not None
        # On a node's tier, the writer's own disk, or a holder's for the peer tiers.
        node = None
        if tier in ON_NODES:
            node = self.model.nodes[0] if tier == LOCAL else self.model.holders[0]
        if node in self.model.lost_nodes:
            return
        n = len(self.model.unregistered)
        self.put_unregistered(tier, node, sm.step, f"UNREGISTERED-extra-{n}.txt", os.urandom(32))
        self.model.count("extra file")

    def damage_target(self, pick: int, tier: str, which: int) -> tuple[StepModel, str, str] | None:
        sm = self.pick(pick)
        if sm is None:
            return None
        cp = self.checkpoint(sm.step)
        if cp is None:
            return None
        verified = self.verified_on(cp, tier)
        undamaged = sorted(p for p in verified if (tier, p) not in sm.damage)
        if not undamaged:
            return None
        path = undamaged[which % len(undamaged)]
        if not self.whole_tiers(cp, sm, but=tier):
            # The test destroys what may be the only good copy: losing it is no bug.
            sm.destroyed = True
        return sm, path, verified[path]

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), tier=st.sampled_from(TIERS), which=st.integers(0, 3))
    def flip_byte(self, pick: int, tier: str, which: int) -> None:
        target = self.damage_target(pick, tier, which)
        if target is None:
            return
        sm, path, location = target
        data = self.stack.read_location(location)
        if data is None or not data:
            return
        flipped = bytes([data[0] ^ 0x01]) + data[1:]
        self.write_location(location, flipped)
        sm.damage.add((tier, path))
        sm.damaged_tiers.add(tier)
        self.model.count(f"flip byte: {tier}")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), tier=st.sampled_from((SHARED, S3)), which=st.integers(0, 3))
    def delete_behind_back(self, pick: int, tier: str, which: int) -> None:
        target = self.damage_target(pick, tier, which)
        if target is None:
            return
        sm, path, location = target
        if location.startswith("s3://"):
            bucket, _, key = location[len("s3://") :].partition("/")
            self.stack.s3.delete_object(Bucket=bucket, Key=key)
        else:
            Path(location).unlink(missing_ok=True)
        sm.damage.add((tier, path))
        sm.damaged_tiers.add(tier)
        self.model.count(f"delete behind back: {tier}")

    @precondition(lambda self: self.model.steps)
    @rule(
        pick=st.integers(0, 63),
        tier=st.sampled_from((LOCAL, PEER, PEER2, SHARED)),
        which=st.integers(0, 3),
        half=st.booleans(),
    )
    def truncate(self, pick: int, tier: str, which: int, half: bool) -> None:
        """A verified copy's file cut short at rest (to half its size, or empty): a disk that
        lost its tail, a copy tool killed half-way."""
        target = self.damage_target(pick, tier, which)
        if target is None:
            return
        sm, path, location = target
        os.truncate(location, len(sm.shards[path].data) // 2 if half else 0)
        sm.damage.add((tier, path))
        sm.damaged_tiers.add(tier)
        self.model.count(f"truncate: {tier}")

    def write_location(self, location: str, data: bytes) -> None:
        if location.startswith("s3://"):
            bucket, _, key = location[len("s3://") :].partition("/")
            self.stack.s3.put_object(Bucket=bucket, Key=key, Body=data)
        else:
            Path(location).write_bytes(data)

    def lose(self, node: str) -> None:
        """The node's disks are gone for good (its local and its peer copies), and an operator
        says so. Its worker goes on serving its queue, as the dev stack's would: an expiry
        already begun there still deletes (from nothing) and ends."""
        m = self.model
        r = self.call("POST", f"/v1/nodes/{node}/lost", "operate")
        assert r.status_code == 200, r.text
        m.lost_nodes.add(node)
        for tier in (LOCAL, *PEERS):
            for job in (m.job, m.victim_job):
                where = self.stack.step_dir(tier, node, job, 0).parent
                shutil.rmtree(where, ignore_errors=True)
        for key in [k for k in m.unregistered if k[1] == node]:
            del m.unregistered[key]
        for sm in m.registered():
            cp = self.checkpoint(sm.step)
            if cp is None:
                sm.destroyed = True
            elif any(s.node == node for s in sm.shards.values()):
                # Its shards there had no copy elsewhere yet, or none left whole.
                sm.destroyed |= not self.whole_tiers(cp, sm, but=LOCAL)
            elif not any(t["state"] == "pending" for t in cp["tiers"]):
                # In flight, it is copied from its writers' disks; else what is left whole.
                sm.destroyed |= not self.whole_tiers(cp, sm)

    @precondition(lambda self: self.model.writers[1] not in self.model.lost_nodes)
    @rule()
    def node_lost(self) -> None:
        """The second writer is lost: its own shards' local copies, and the peer copies of the
        first writer's shards it held."""
        self.lose(self.model.writers[1])
        self.model.count("node lost")

    @precondition(lambda self: not set(self.model.holders) & self.model.lost_nodes)
    @rule(which=st.integers(0, 1))
    def holder_lost(self, which: int) -> None:
        """A node that wrote nothing and held only peer copies is lost: every copy it held is
        made again on the live nodes, K copies on K distinct nodes while there are enough."""
        self.lose(self.model.holders[which])
        self.model.count("holder lost")
