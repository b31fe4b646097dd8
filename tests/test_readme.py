"""The first-day path, as a newcomer takes it: every ```sh block of README.md and of
examples/train_resume/README.md, command by command and exactly as written, each in the terminal
the page names, in a fresh directory laid out like a clone, against the dev stack that the page's
first command starts (the test starts it, on a free port). How the pages are run:
tests/helpers/readme.py.

What the pages promise is checked against the runs themselves, never against numbers printed on
the page: the digests a training run prints depend on the machine's CPU kernels (the page's are
one machine's), the promise is that a resumed run prints the digest it saved and ends on the
digest of an uninterrupted run measured here."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator

import pytest

from tests.helpers.readme import (
    DONE,
    HARNESS_FILES,
    PEER_SECTION,
    ROOT,
    SAVED,
    Clone,
    blocks,
    commands,
    latest,
    long_running,
    run_page,
    running_clone,
    tier_state,
)

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

TRAIN_RESUME = "examples/train_resume/README.md"
RESUMED = re.compile(r"^resumed from step (\d+) \(state (\w+);", re.M)
# Every line a training run prints, as the page shows them (the page's `...` for lines left out).
OUTPUT_LINE = re.compile(
    r"torch \S+, CPU kernels \w+"
    r"|[\w.-]+: no restorable checkpoint, starting from step 0"
    r"|step \d+: loss \d+\.\d{6}, checkpointing \(state [0-9a-f]{16}\)"
    r"|step \d+: saved by an earlier run"
    r"|resumed from step \d+ \(state [0-9a-f]{16}; read [^;)]+(; kept [^)]+)?\)"
    r"|done at step \d+ \(state [0-9a-f]{16}\)"
    r"|\.\.\."
)


@pytest.fixture(scope="module")
def clone() -> Iterator[Clone]:
    # The README's `python3 bootstrap.py dev`.
    yield from running_clone(["python3", "bootstrap.py", "dev"])


@pytest.fixture
def peer_clone() -> Iterator[Clone]:
    """A clone running the stack that PEER_SECTION starts (its `dev` command as written); only
    for its test, so that it is stopped before the other tests' stack starts."""
    dev = next(c for b in blocks(TRAIN_RESUME, "sh", PEER_SECTION) for c in commands(b))
    argv = shlex.split(dev)
    assert long_running(dev) and "--data-dir" in argv, dev
    yield from running_clone(argv, data_dir=argv[argv.index("--data-dir") + 1])


def _peer_copy_restorable(clone: Clone, job: str, output: str) -> bool:
    """The newest checkpoint the run saved is restorable on the peer tier (so the restart reads
    that one, from there)."""
    saved = SAVED.findall(output)
    return len(saved) >= 2 and latest(clone, job, "peer") == int(saved[-1][0])


def _resumed_as_promised(killed: str, resumed_run: str, uninterrupted: str) -> re.Match[str]:
    """What the page promises of a killed run, its restart and a run of the same steps that
    never stopped, all three measured on this machine: the restart prints the digest the killed
    run saved at the step it resumed from, and ends on the uninterrupted run's digest; every
    step both saved has one digest."""
    resumed = RESUMED.search(resumed_run)
    assert resumed is not None, resumed_run
    saved, straight = dict(SAVED.findall(killed)), dict(SAVED.findall(uninterrupted))
    assert saved[resumed[1]] == resumed[2], "not the state saved"
    both = saved.keys() & straight.keys()
    assert both and all(saved[s] == straight[s] for s in both), (killed, uninterrupted)
    done = [DONE.search(out) for out in (resumed_run, uninterrupted)]
    assert done[0] is not None and done[1] is not None, (resumed_run, uninterrupted)
    assert done[0][0] == done[1][0], "the resumed run ended in another state"
    return resumed


def _output_shown_as_printed(page: str, section: str | None = None) -> None:
    """Every output line the page shows has the form a run prints (not its digests: those are
    the machine's)."""
    shown = [line for b in blocks(page, "", section) for line in b.splitlines() if line.strip()]
    assert shown, page
    odd = [line for line in shown if not OUTPUT_LINE.fullmatch(line)]
    assert odd == [], f"{page} shows lines no run prints: {odd}"


# Run first: its stack stops before the module's own starts (they would share two cores).
def test_a_lost_nodes_rank_resumes_on_a_spare_node_from_the_peer_copy(
    peer_clone: Clone,
) -> None:
    ran = run_page(peer_clone, TRAIN_RESUME, PEER_SECTION, _peer_copy_restorable)
    training = [out for cmd, out in ran if "torchrun" in cmd]
    killed, resumed_run, uninterrupted = training
    # From the third terminal, after `source` of the stack's stack.env.
    listed = next(out for cmd, out in ran if cmd.startswith("tierpoint checkpoints list"))
    assert "peer" in listed and "restorable" in listed, listed
    assert "declared lost" in next(out for cmd, out in ran if "node-lost" in cmd)
    resumed = _resumed_as_promised(killed, resumed_run, uninterrupted)
    # Every file came from the peer tier: node-1's from node-2's disk, node-2's from node-3's.
    read = re.search(r"; read (.*?)(;|\))", resumed_run)
    assert read is not None, resumed_run
    files = dict(f.rsplit(" from ", 1) for f in read[1].split(", "))
    assert {".metadata", "__0_0.distcp"} <= set(files), read[1]
    assert set(files.values()) == {"peer"}, read[1]
    # Node-1's files, kept on the spare node's local tier: there until the step's local copy
    # expires (the run saves two newer steps, which the local tier keeps), then gone with it.
    assert re.search(r"; kept [^)]*\b__0_0\.distcp\b[^)]* on node-3\)", resumed_run), resumed_run
    kept = peer_clone.root / peer_clone.data_dir / "nodes" / "node-3" / "ssd" / "peer-demo"
    local = tier_state(peer_clone, "peer-demo", int(resumed[1]), "ssd")
    if local in ("expiring", "expired"):
        assert local == "expiring" or not (kept / resumed[1]).exists(), resumed_run
    else:
        assert {".metadata", "__0_0.distcp"} <= {p.name for p in (kept / resumed[1]).iterdir()}
    _output_shown_as_printed(TRAIN_RESUME, PEER_SECTION)


def test_the_readme_runs_as_written(clone: Clone) -> None:
    ran = dict(run_page(clone, "README.md"))
    demo = next(out for cmd, out in ran.items() if cmd.startswith("python3 bootstrap.py demo"))
    assert "step 300" in demo, demo
    restore = shlex.split(next(c for c in ran if c.startswith("tierpoint restore ")), comments=True)
    restored = [p for p in (clone.root / restore[3]).rglob("*") if p.is_file()]
    assert restored, "restore wrote nothing"
    status = next(out for cmd, out in ran.items() if cmd.startswith("tierpoint status"))
    assert "demo-1" in status, status
    # What the page's commands leave in a checkout, git ignores: nothing to commit by mistake.
    made = [p for p in clone.root.iterdir() if not p.is_symlink() and p.name not in HARNESS_FILES]
    for path in made:
        name = path.name + ("/" if path.is_dir() else "")
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT)
        assert ignored.returncode == 0, f"the README leaves {name} in the checkout, not ignored"


def test_train_resume_runs_as_written_and_resumes_with_the_saved_state(clone: Clone) -> None:
    ran = run_page(clone, TRAIN_RESUME)
    training = [out for cmd, out in ran if "torchrun" in cmd]
    killed, resumed_run, uninterrupted = training
    _resumed_as_promised(killed, resumed_run, uninterrupted)
    listed = next(out for cmd, out in ran if cmd.startswith("tierpoint checkpoints list"))
    assert "train-resume-demo" in listed, listed
    _output_shown_as_printed(TRAIN_RESUME)


def test_dev_prints_the_dashboard_link_and_whole_values_in_its_log(clone: Clone) -> None:
    """Off a terminal (this log file) the banner names the dashboard link with $TIERPOINT_TOKEN
    in place of the token, cuts no value, and holds no colour codes."""
    log = clone.dev_log.read_text()
    facts = json.loads(clone.stack_json.read_text())
    assert f"dashboard: {facts['api_url']}/#token=$TIERPOINT_TOKEN" in log, log
    assert facts["token"] not in log
    postgres = clone.root.resolve() / ".tierpoint" / "dev" / "postgres"
    assert f"host={postgres}" in log, log
    assert "\x1b[" not in log
