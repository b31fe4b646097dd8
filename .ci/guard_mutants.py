#!/usr/bin/env python3
"""Guard mutation check: every safety guard, broken by hand one at a time, must fail a test.

Each mutant below names a guard by an exact snippet of its source and a replacement that breaks
it, plus the tests that should notice. The check copies the working tree (tracked and untracked,
not ignored, files) into a scratch directory, applies one mutant there, runs only its tests with
the repository's own .venv (cwd, PYTHONPATH and rootdir all point at the scratch copy, so the
mutated modules are the ones imported), and puts the file back. It exits non-zero when a mutant
survives (1; a mutant marked as a known survivor, with its reason, is run and reported but does
not count), or when the table has rotted (2): a snippet not found exactly once, a test file or
test that does not exist, a mutant that does not compile.

    python3 .ci/guard_mutants.py                 # every mutant
    python3 .ci/guard_mutants.py --list          # the table
    python3 .ci/guard_mutants.py --only ID ...   # some of them
    python3 .ci/guard_mutants.py --baseline      # first run the selected tests unmutated

Source files move on main from time to time: a snippet that is no longer found stops the check
with the mutant's id, so the table is updated rather than silently skipped.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Only a guard against a hang: a mutant that makes its tests hang counts as killed (timeout).
RUN_TIMEOUT = 300.0
# Hypothesis: a fixed seed and a modest example count, so a run decides the same way each time.
HYPOTHESIS_SEED = "0"
RETENTION_EXAMPLES = "200"


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str
    # Set, with the reason, for a mutant no reasonable test can kill: it is run and reported
    # every time, but does not fail the check (and fails it once a test does kill it, so the
    # mark is removed).
    known_survivor: str = ""


RET_E2E = "tests/workflows/test_retention.py"
RECHECK = "tests/workflows/test_retention_recheck.py"
TRIGGER = "tests/workflows/test_lifecycle_requests_retention.py"
PLANNER_TESTS = (
    "tests/tierpoint/retention/test_planner_examples.py",
    "tests/tierpoint/retention/test_planner_properties.py",
)
PATH_TESTS = (
    "tests/tierpoint/storage/test_paths.py",
    "tests/tierpoint/storage/test_confinement.py",
    "tests/tierpoint/storage/test_posix.py",
)
WRONG_CRC = "tests/workflows/test_lifecycle.py::test_shard_with_wrong_checksum_is_never_promoted"
ROTTING = "tests/activities/test_lifecycle.py::test_source_rotting_after_seal_is_caught_by_the_copy"
PLANNER = "tierpoint/retention/planner.py"
PATHS = "tierpoint/storage/paths.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- executing retention: the re-check under row locks -----------------------------------
    Mutant(
        "recheck-kept-now",
        "tierpoint/catalog/expiry_repo.py",
        """    if expiry is None:
        keep = next(
            (k for k in fresh.keeps if k.checkpoint_id == checkpoint_id and k.tier == tier), None
        )
        why = ", ".join(keep.reasons) if keep is not None else "not planned any more"
        return BeginResult(state=BeginState.SKIPPED, reason=f"kept now: {why}")
""",
        """    if expiry is None:
        from tierpoint.retention.models import Expiry, ExpiryRule

        expiry = Expiry(
            checkpoint_id=checkpoint_id,
            step=0,
            tier=tier,
            bytes=0,
            rule=ExpiryRule.NOT_KEPT,
            reason="mutant: planned earlier",
        )
""",
        (RECHECK,),
        "a pin or lease taken after planning must cancel the expiry",
    ),
    Mutant(
        "recheck-row-lock",
        "tierpoint/catalog/expiry_repo.py",
        "select(Checkpoint.id).where(Checkpoint.id == checkpoint_id).with_for_update()",
        "select(Checkpoint.id).where(Checkpoint.id == checkpoint_id)",
        (RECHECK,),
        "the re-check must wait for a pin or lease insert in flight on the checkpoint row",
    ),
    # ---- the lifecycle asks for retention after each promotion -------------------------------
    Mutant(
        "request-activity-noop",
        "activities/retention.py",
        "        await request_retention(self._need_client(), inp.job, inp.reason)\n",
        "        return None\n",
        (TRIGGER,),
        "a promotion must start the job's retention run (nothing else may be needed)",
    ),
    Mutant(
        "lifecycle-no-request",
        "workflows/checkpoint_lifecycle.py",
        """            if workflow.patched(RETENTION_PATCH):
                await self._request_retention(plan, tier)
""",
        """            if workflow.patched(RETENTION_PATCH):
                pass
""",
        (TRIGGER,),
        "the lifecycle workflow must request retention after a promotion",
    ),
    # ---- promote: restorable only when every shard is verified -------------------------------
    Mutant(
        "promote-count",
        "tierpoint/catalog/lifecycle_repo.py",
        "    if verified == total and stage_error is None:\n",
        "    if stage_error is None:\n",
        (WRONG_CRC, ROTTING),
        "a tier with an unverified shard must not become restorable",
    ),
    Mutant(
        "promote-verified-filter",
        "tierpoint/catalog/lifecycle_repo.py",
        """            Replica.tier == tier,
            Replica.state == ReplicaState.VERIFIED.value,
        )
    )
    assert total is not None and verified is not None""",
        """            Replica.tier == tier,
        )
    )
    assert total is not None and verified is not None""",
        (WRONG_CRC, ROTTING),
        "only verified replicas count towards promotion",
    ),
    # ---- planner protections -----------------------------------------------------------------
    Mutant(
        "planner-pinned",
        PLANNER,
        "        why.append(KeepReason.PINNED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a pinned checkpoint never expires",
    ),
    Mutant(
        "planner-leased",
        PLANNER,
        "        why.append(KeepReason.LEASED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a leased checkpoint never expires",
    ),
    Mutant(
        "planner-quarantined",
        PLANNER,
        "        why.append(KeepReason.QUARANTINED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a quarantined copy is left for the operator",
    ),
    Mutant(
        "planner-latest-durable",
        PLANNER,
        "        why.append(KeepReason.LATEST_DURABLE)\n",
        "        pass\n",
        PLANNER_TESTS,
        "the latest restorable checkpoint on the most durable tier stays",
    ),
    Mutant(
        "planner-in-flight",
        PLANNER,
        "        why.append(KeepReason.IN_FLIGHT)\n",
        "        pass\n",
        PLANNER_TESTS,
        "the source of a copy in flight stays",
    ),
    Mutant(
        "planner-awaiting-durable",
        PLANNER,
        "        why.append(KeepReason.AWAITING_DURABLE)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a local copy stays until the durable tier it is meant for has it",
    ),
    Mutant(
        "planner-no-good-copy",
        PLANNER,
        "        why.append(KeepReason.NO_GOOD_COPY)\n",
        "        pass\n",
        PLANNER_TESTS,
        "remnants of a kept checkpoint without any good copy stay",
    ),
    Mutant(
        "planner-last-copy",
        PLANNER,
        """            del expire[(c.id, good_on[-1])]
            reasons[(c.id, good_on[-1])] = [KeepReason.LAST_COPY]
""",
        "            pass\n",
        PLANNER_TESTS,
        "a kept checkpoint never loses its last good copy to keep rules",
    ),
    Mutant(
        "planner-last-copy-quota",
        PLANNER,
        """                    held.insert(0, KeepReason.LAST_COPY)
                    continue
""",
        "                    pass\n",
        PLANNER_TESTS,
        "a quota never takes the last good copy of a checkpoint another tier keeps",
    ),
    # ---- path confinement --------------------------------------------------------------------
    Mutant(
        "paths-dotdot",
        PATHS,
        '        if part in (".", ".."):\n',
        '        if part == ".":\n',
        PATH_TESTS,
        "a '..' component is refused",
    ),
    Mutant(
        "paths-absolute",
        PATHS,
        '    if path.startswith("/"):\n',
        "    if False:\n",
        PATH_TESTS,
        "an absolute shard path is refused",
    ),
    Mutant(
        "paths-symlink-parent",
        PATHS,
        "    if not _inside(real_root, parent) or parent == real_root:\n",
        "    if parent == real_root:\n",
        PATH_TESTS,
        "a directory symlink out of the root is refused",
    ),
    Mutant(
        "paths-symlink-shard",
        PATHS,
        "        if not _inside(real_root, real) or real == real_root:\n",
        "        if real == real_root:\n",
        PATH_TESTS,
        "a shard symlink out of the root is refused",
    ),
    Mutant(
        "paths-symlink-checkpoint-dir",
        PATHS,
        "    if not _inside(real_root, target) or target == real_root:\n",
        "    if target == real_root:\n",
        PATH_TESTS,
        "a checkpoint directory symlinked out of the root is refused",
    ),
    Mutant(
        "paths-symlink-mkdir",
        PATHS,
        "        if not _inside(real_root, real):\n",
        "        if False:\n",
        PATH_TESTS,
        "creating directories never goes through a symlink out of the root",
    ),
    Mutant(
        "paths-nofollow",
        PATHS,
        "os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)",
        "os.open(path, flags | os.O_CLOEXEC, mode)",
        PATH_TESTS,
        "a symlink at the final component (the temp name a copy writes) is not followed",
    ),
    # ---- checksums: seal, copy, verify -------------------------------------------------------
    Mutant(
        "seal-crc",
        "activities/lifecycle.py",
        "            elif sh.checksum is not None and v.crc32c != sh.checksum.lower():\n",
        "            elif False:\n",
        (WRONG_CRC,),
        "a sealed shard whose crc32c differs from the registered one is corrupt",
    ),
    Mutant(
        "copy-source-crc",
        "activities/copy.py",
        "        if copied.crc32c != registered or copied.size != sh.size:\n",
        "        if copied.size != sh.size:\n",
        (ROTTING,),
        "bytes read off the source with the wrong crc32c mark the source corrupt",
    ),
    Mutant(
        "copy-readback",
        "activities/copy.py",
        "        if v.ok:\n            self._verified(pending.shard, pending.location)\n",
        "        if True:\n            self._verified(pending.shard, pending.location)\n",
        (ROTTING,),
        "a copy whose read-back fails is not verified",
        known_survivor="the read-back fails only when the destination returns other bytes than "
        "were written (a lost write, bit rot, a concurrent writer); the real stores never do, and "
        "making one do it takes a fault-injecting store (a stub) or a faulty block device. "
        "posix-verify-crc and s3-verify-crc prove the verify itself",
    ),
    Mutant(
        "posix-verify-crc",
        "tierpoint/storage/posix/store.py",
        "        if crc != expected:\n",
        "        if False:\n",
        ("tests/tierpoint/storage/test_posix.py",),
        "POSIX verify compares the crc32c read from the device",
    ),
    Mutant(
        "s3-verify-crc",
        "tierpoint/storage/s3/store.py",
        "        got = crc32c_hex(stored)\n        if stored != expected:\n",
        "        got = crc32c_hex(stored)\n        if False:\n",
        ("tests/tierpoint/storage/test_s3.py",),
        "S3 verify compares the stored (or read-back) crc32c",
    ),
    # ---- registration: a different manifest at a registered step is a 409 --------------------
    Mutant(
        "register-digest",
        "tierpoint/catalog/registration.py",
        "    if row.manifest_digest != digest:\n",
        "    if False:\n",
        ("tests/api/test_register.py",),
        "a different manifest for a registered step is refused",
    ),
    # ---- expiring before delete --------------------------------------------------------------
    Mutant(
        "delete-marker-check",
        "activities/retention.py",
        "        if state not in (TierState.EXPIRING.value, TierState.EXPIRED.value):\n",
        "        if False:\n",
        (f"{RET_E2E}::test_crash_between_begin_and_delete_is_finished_by_the_next_run",),
        "the delete activity refuses a copy whose marker is not expiring",
    ),
    Mutant(
        "workflow-delete-before-begin",
        "workflows/retention.py",
        """        try:
            begun: BeginResult = await workflow.execute_activity(
""",
        """        try:
            await self._delete(job, task)
            begun: BeginResult = await workflow.execute_activity(
""",
        (f"{RET_E2E}::test_lease_blocks_expiry_until_released_or_timed_out",),
        "bytes are deleted only after the marker is expiring (committed)",
    ),
    Mutant(
        "workflow-delete-whatever-begin-said",
        "workflows/retention.py",
        """                return False
            if begun.state is BeginState.EXPIRING:
                await self._delete(job, task)
""",
        """            await self._delete(job, task)
""",
        (RECHECK,),
        "a copy the re-check kept is not deleted",
    ),
)


def _git_files(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (repo / p).is_file()})


def _table_errors(mutants: list[Mutant], repo: Path) -> list[str]:
    errors = []
    ids = [m.id for m in MUTANTS]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        errors.append(f"{dup}: id used more than once")
    for m in mutants:
        f = repo / m.path
        if not f.is_file():
            errors.append(f"{m.id}: {m.path} does not exist")
            continue
        source = f.read_text()
        n = source.count(m.original)
        if n != 1:
            errors.append(f"{m.id}: its snippet occurs {n} times in {m.path}, not once")
            continue
        try:
            compile(source.replace(m.original, m.replacement), m.path, "exec")
        except SyntaxError as exc:
            errors.append(f"{m.id}: the mutated {m.path} does not compile: {exc}")
        for t in m.tests:
            test_file = t.split("::", 1)[0]
            if not (repo / test_file).is_file():
                errors.append(f"{m.id}: test file {test_file} does not exist")
            elif "::" in t:
                name = t.split("::")[-1].split("[", 1)[0]
                if not re.search(rf"def {re.escape(name)}\(", (repo / test_file).read_text()):
                    errors.append(f"{m.id}: no test {name} in {test_file}")
    return errors


def _copy_tree(repo: Path, scratch: Path) -> None:
    for rel in _git_files(repo):
        dst = scratch / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dst, follow_symlinks=False)


def _env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(scratch)
    # Restoring a file within the second it was mutated, at the same size, would let a stale
    # .pyc of the mutant be used: no bytecode files at all.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TIERPOINT_RETENTION_EXAMPLES"] = RETENTION_EXAMPLES
    env.pop("TIERPOINT_RECORD_HISTORY", None)
    return env


def _check_imports(python: Path, scratch: Path) -> None:
    """The scratch copy's modules, not the repository's, are what the tests import."""
    probe = (
        "import activities, api, tests, tierpoint, workflows; "
        "print('\\n'.join(m.__file__ for m in (activities, api, tests, tierpoint, workflows)))"
    )
    out = subprocess.run(
        [str(python), "-c", probe],
        cwd=scratch,
        env=_env(scratch),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    real = os.path.realpath(scratch)
    stray = [p for p in out if not os.path.realpath(p).startswith(real + os.sep)]
    if stray:
        sys.exit(f"guard mutants: the tests would import modules outside the scratch copy: {stray}")


def _pytest(python: Path, scratch: Path, tests: tuple[str, ...]) -> tuple[int | None, str]:
    shutil.rmtree(scratch / ".hypothesis", ignore_errors=True)
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(scratch),
        "-c",
        str(scratch / "pyproject.toml"),
        f"--hypothesis-seed={HYPOTHESIS_SEED}",
        *tests,
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=scratch,
            env=_env(scratch),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        return None, out if isinstance(out, str) else out.decode(errors="replace")
    return proc.returncode, proc.stdout + proc.stderr


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ", 1)[0]
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument(
        "--baseline", action="store_true", help="run the selected tests unmutated first"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    args = parser.parse_args()

    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.id for m in MUTANTS}
        if unknown:
            parser.error(f"unknown mutant ids: {', '.join(sorted(unknown))}")
        mutants = [m for m in MUTANTS if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:36} {m.path:36} {' '.join(m.tests)}\n{'':36} {m.why}")
        return 0

    errors = _table_errors(mutants, REPO)
    if errors:
        print("guard mutants: the table does not match the source:", *errors, sep="\n  ")
        return 2
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        print(f"guard mutants: {python.relative_to(REPO)} is missing (python3 bootstrap.py test)")
        return 2

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="tierpoint-mutants-"))
    rows: list[tuple[str, str, str, str, float, str]] = []
    try:
        _copy_tree(REPO, scratch)
        _check_imports(python, scratch)
        if args.baseline:
            union = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            t0 = time.monotonic()
            rc, out = _pytest(python, scratch, union)
            print(f"baseline: {len(union)} test selections, rc={rc}, {time.monotonic() - t0:.0f} s")
            if rc != 0:
                print(out[-4000:])
                print("guard mutants: the tests fail without any mutant")
                return 2
        for m in mutants:
            target = scratch / m.path
            original = target.read_text()
            target.write_text(original.replace(m.original, m.replacement, 1))
            t0 = time.monotonic()
            try:
                rc, out = _pytest(python, scratch, m.tests)
            finally:
                target.write_text(original)
            secs = time.monotonic() - t0
            if rc is None:
                result, by = "killed", "timeout"
            elif rc in (1, 2):
                result, by = "killed", _first_failure(out)
            elif rc == 0:
                result, by = ("survived" if m.known_survivor else "SURVIVED"), ""
            else:
                print(out[-4000:])
                print(f"guard mutants: pytest ended with {rc} for {m.id} (usage or collection)")
                return 2
            rows.append((m.id, m.path, " ".join(m.tests), result, secs, by))
            print(
                f"{m.id:36} {m.path:36} {result:8} {secs:6.1f} s  {by or m.why}",
                flush=True,
            )
    finally:
        if args.keep:
            print(f"scratch copy kept at {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    total = time.monotonic() - started
    by_id = {m.id: m for m in MUTANTS}
    killed = [r[0] for r in rows if r[3] == "killed"]
    survived = [r[0] for r in rows if r[3] != "killed"]
    unexpected = [i for i in survived if not by_id[i].known_survivor]
    stale = [i for i in killed if by_id[i].known_survivor]
    print()
    print(f"{'mutant':36} {'file':36} {'result':8} {'seconds':>8}  tests run")
    for mid, path, tests, result, secs, _ in rows:
        print(f"{mid:36} {path:36} {result:8} {secs:8.1f}  {tests}")
    for mid in survived:
        m = by_id[mid]
        if m.known_survivor:
            print(f"survived (known): {mid}: {m.known_survivor}")
        else:
            print(f"survived: {mid}: no test noticed that this stopped holding: {m.why}")
    for mid in stale:
        print(f"killed, but marked a known survivor: {mid}: remove its known_survivor mark")
    print(f"guard mutants: {len(killed)} killed, {len(survived)} survived, {total:.0f} s")
    return 1 if unexpected or stale else 0


if __name__ == "__main__":
    sys.exit(main())
