"""Where `tierpoint restore JOB DIR` writes, as a user meets it: a DIR that already holds files
(an older run's shards, a stale `rank-00009-of-00010.bin` that a loader globbing the folder would
pick up) is refused, nothing written, unless `--force` (the checkpoint's files replace theirs,
the others stay and are named) or `--clean` (DIR holds exactly the checkpoint); a DIR that is a
regular file is one clear line; and Ctrl-C (a real SIGINT to a real `tierpoint restore`) in the
middle of a shard leaves DIR as it was, says so, and releases the restore's lease.

Real stack: the API under uvicorn, Temporal workers, Postgres, the shared directory and moto S3
(tests/client/conftest.py). The shard being read when Ctrl-C comes is a named pipe put in place
of its copy on the shared tier: its read blocks until the test feeds it, so the interrupt lands
mid-shard by construction, never by timing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from tierpoint_client import TierpointError, build_manifest

from tests.helpers.cli import run_cli
from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.tokens import bearer

WAIT = 300.0  # hang guard only
KIB = 1024
SHARDS = {
    "rank-00000-of-00004.bin": 300 * KIB,
    "rank-00001-of-00004.bin": 200 * KIB + 1,
    "rank-00002-of-00004.bin": 7,
    "rank-00003-of-00004.bin": 256 * KIB,
}
LAST = "rank-00003-of-00004.bin"
STALE = "rank-00009-of-00010.bin"


async def _checkpoint(stack: Stack) -> tuple[str, int, dict[str, bytes]]:
    """A checkpoint of four ranks written on node a, restorable on the shared tier and S3."""
    job, step, node = f"dest-{uuid.uuid4().hex[:10]}", 4, stack.nodes[0]
    local = stack.local_dir(node, job, step)
    shards = write_shards(local, SHARDS)
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    # The copies to the shared tier and S3 run side by side: either may finish first.
    for tier in ("lustre", "s3"):
        await stack.wait_restorable(job, step, tier, WAIT)
    return job, step, shards


def _older_run(dest: Path) -> dict[str, bytes]:
    """What an earlier restore of a ten-rank run left in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "rank-00000-of-00004.bin").write_bytes(b"an older step's rank 0")
    (dest / STALE).write_bytes(b"a rank the new checkpoint does not have")
    (dest / "old").mkdir()
    (dest / "old" / "notes.txt").write_bytes(b"kept by hand")
    return read_tree(dest)


async def _leases(stack: Stack, job: str, step: int) -> list[dict[str, object]]:
    """Every lease ever taken on the checkpoint (released and expired ones too)."""
    async with httpx.AsyncClient(base_url=stack.api_url, headers=bearer(stack.token)) as http:
        r = await http.get(f"/v1/jobs/{job}/checkpoints/{step}/leases", params={"all": "true"})
    assert r.status_code == 200, r.text
    items: list[dict[str, object]] = r.json()["items"]
    return items


async def test_a_directory_holding_files_is_refused_and_nothing_is_written(
    stack: Stack, tmp_path: Path
) -> None:
    job, step, _ = await _checkpoint(stack)
    dest = tmp_path / "restored"
    before = _older_run(dest)

    out = await run_cli(stack.api_url, "restore", job, str(dest), token=stack.token)
    assert out.exit_code == 1, out.output
    assert "is not empty" in out.output and STALE in out.output, out.output
    assert "verified" not in out.output, out.output
    assert read_tree(dest) == before
    # Refused before the API was asked: no lease was taken for it.
    assert await _leases(stack, job, step) == []

    # The same from Python: refused, nothing written.
    with pytest.raises(TierpointError, match="is not empty"):
        await asyncio.to_thread(stack.client.restore, job, dest)
    assert read_tree(dest) == before


async def test_force_replaces_the_checkpoints_files_and_names_the_others(
    stack: Stack, tmp_path: Path
) -> None:
    job, _, shards = await _checkpoint(stack)
    dest = tmp_path / "restored"
    before = _older_run(dest)

    out = await run_cli(stack.api_url, "restore", job, str(dest), "--force", token=stack.token)
    assert out.exit_code == 0, out.output
    assert "verified 4 shards" in out.output, out.output
    # The stale rank stays, and the user is told, with the way to remove it.
    assert STALE in out.output and "--clean" in out.output, out.output
    kept = {p: b for p, b in before.items() if p not in shards}
    assert read_tree(dest) == shards | kept


async def test_clean_leaves_exactly_the_checkpoint(stack: Stack, tmp_path: Path) -> None:
    job, _, shards = await _checkpoint(stack)
    dest = tmp_path / "restored"
    _older_run(dest)
    # A directory where the checkpoint has a file is in the way too: --clean replaces it.
    (dest / "rank-00002-of-00004.bin").mkdir()
    (dest / "rank-00002-of-00004.bin" / "x").write_bytes(b"x")

    out = await run_cli(stack.api_url, "restore", job, str(dest), "--clean", token=stack.token)
    assert out.exit_code == 0, out.output
    assert "verified 4 shards" in out.output and "removed 3 entries" in out.output, out.output
    assert read_tree(dest) == shards
    assert sorted(os.listdir(dest)) == sorted(shards)

    # From Python: the same, and what it removed.
    _older_run(tmp_path / "again")
    result = await asyncio.to_thread(
        lambda: stack.client.restore(job, tmp_path / "again", existing="clean")
    )
    assert read_tree(tmp_path / "again") == shards
    assert result.removed == ("old", STALE)


async def test_a_regular_file_as_dest_is_one_clear_line(stack: Stack, tmp_path: Path) -> None:
    job, _, _ = await _checkpoint(stack)
    dest = tmp_path / "not-a-dir"
    dest.write_bytes(b"mine")
    for extra in ((), ("--force",), ("--clean",)):
        out = await run_cli(stack.api_url, "restore", job, str(dest), *extra, token=stack.token)
        assert out.exit_code == 1, out.output
        assert out.output.strip() == f"error: {dest} exists and is not a directory", out.output
        assert dest.read_bytes() == b"mine"


def _cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TIERPOINT_TOKEN", "TIERPOINT_ACTOR")}
    return env | {
        "TIERPOINT_API_URL": stack.api_url,
        "TIERPOINT_TOKEN": stack.token,
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }


@pytest.mark.parametrize(("workers", "dest_exists"), [(1, False), (4, True)])
async def test_ctrl_c_mid_restore_leaves_dest_as_it_was_and_says_so(
    stack: Stack, tmp_path: Path, workers: int, dest_exists: bool
) -> None:
    job, step, shards = await _checkpoint(stack)
    latest = await asyncio.to_thread(stack.client.latest, job)
    assert latest is not None and [e.path for e in latest.plan][-1] == LAST
    assert {e.tier for e in latest.plan} == {"lustre"}
    # The last shard's copy on the shared tier becomes a pipe: reading it blocks until fed.
    stalled = stack.shared_dir(job, step) / LAST
    stalled.unlink()
    os.mkfifo(stalled)
    dest = tmp_path / "restored"
    if dest_exists:
        dest.mkdir()

    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "apps.cli.main", "restore", job, str(dest)),
        *("--workers", str(workers)),
        env=_cli_env(stack),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # As a terminal starts it: a suite run in the background of a shell (CI's, nohup) has
        # SIGINT ignored, which a child inherits and Python then keeps (no KeyboardInterrupt).
        preexec_fn=_sigint_default,
    )
    opening = asyncio.ensure_future(asyncio.to_thread(os.open, stalled, os.O_WRONLY))
    fed = False
    try:
        # Opening the pipe returns once the restore opens it to read the last shard.
        fd = await asyncio.wait_for(asyncio.shield(opening), WAIT)
        fed = True
        try:
            os.write(fd, shards[LAST][: 16 * KIB])
            proc.send_signal(signal.SIGINT)
            await _feed_until_exit(proc, fd, len(shards[LAST]))
        finally:
            os.close(fd)
        out = (await asyncio.wait_for(proc.communicate(), WAIT))[0].decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await _unblock(stalled, None if fed else opening)
        stalled.unlink()
        stalled.write_bytes(shards[LAST])

    assert proc.returncode == 130, out
    if dest_exists:
        assert f"{dest} is as it was before the restore" in out, out
        assert os.listdir(dest) == []
    else:
        assert f"{dest} was not created" in out, out
        assert not dest.exists()
    assert "shards had been copied and verified, and were removed" in out, out
    # The lease the restore held is released, not left to lapse.
    leases = await _leases(stack, job, step)
    assert len(leases) == 1 and leases[0]["released_at"] is not None, leases


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def _feed_until_exit(proc: asyncio.subprocess.Process, fd: int, limit: int) -> None:
    """Feed the pipe a little at a time until the restore exits: a copying thread blocked on it
    reads on, and stops at its next chunk once the restore gave up. Never the whole shard (the
    test fails if the restore finishes it); the reads end at `limit` bytes."""
    fed = 16 * KIB
    while proc.returncode is None and fed < limit - 4 * KIB:
        try:
            os.write(fd, b"\0" * (4 * KIB))
        except BrokenPipeError:
            return  # the reader is gone: the restore exited
        fed += 4 * KIB
        try:
            await asyncio.wait_for(proc.wait(), 0.05)
        except TimeoutError:
            continue


async def _unblock(pipe: Path, opening: asyncio.Future[int] | None) -> None:
    """Whoever still waits on the pipe gets its end, so that nothing hangs when a restore did not
    do what the test expects: the test's own open for writing (`opening`, when the restore never
    read the pipe) and any other reader (a read-back of the copy by the server)."""
    if opening is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        with contextlib.suppress(OSError):
            os.close(await opening)
    with contextlib.suppress(OSError):
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
