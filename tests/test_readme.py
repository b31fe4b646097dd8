"""The first-day path, as a newcomer takes it: every ```sh block of README.md and of
examples/train_resume/README.md, command by command and exactly as written, in a fresh directory
laid out like a clone, against the dev stack that the README's first command starts (the test
starts it, on a free port).

Each page is one terminal: variables a command sets or a `source` exports stay for the commands
after it. A command that a later `kill` ends (training, which the page kills "after a few
checkpoints") runs in the background until a checkpoint of its job is restorable. Only commands
that run until stopped are skipped: `dev` itself (the test starts the stack a section asks for),
and `test` (the whole suite)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.client.torch.ranks import require_torch_venv

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "examples/train_resume/README.md")
TRAIN_RESUME = "examples/train_resume/README.md"
# The section of TRAIN_RESUME that runs on a stack of its own (a peer tier, a spare node).
PEER_SECTION = "When a node is lost: resume on a spare node from its peer copy"
# Commands that run until Ctrl-C (the test runs `dev` itself) or run the whole test suite.
LONG_RUNNING = {("python3", "bootstrap.py", "dev"), ("python3", "bootstrap.py", "test")}
TIMEOUT = 600.0  # per command: a hang guard
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
# What a first-day command must never print: a missing program, a refused token, a server error.
BROKEN = re.compile(
    r"command not found|No such file or directory|missing_token|invalid_token|Traceback"
    r'|"status":\s*(401|403|5\d\d)'
)
SAVED = re.compile(r"^step (\d+): loss \S+, checkpointing \(state (\w+)\)$", re.M)
RESUMED = re.compile(r"^resumed from step (\d+) \(state (\w+);", re.M)
DONE = re.compile(r"^done at step \d+ \(state \w+\)$", re.M)
HEADING = re.compile(r"^## (.+)$", re.M)


def blocks(page: str, lang: str, section: str | None = None) -> list[str]:
    """The page's fenced blocks in `lang`: those of its `## section` only, or (None) those of
    every section but PEER_SECTION, which runs against a stack of its own."""
    text = (ROOT / page).read_text()
    parts = HEADING.split(text)  # [intro, title, body, title, body, ...]
    titled = [("", parts[0]), *zip(parts[1::2], parts[2::2], strict=True)]
    wanted = [b for t, b in titled if (t == section if section else t != PEER_SECTION)]
    assert wanted, f"{page} has no section {section!r}"
    return [textwrap.dedent(m[3]) for body in wanted for m in FENCE.finditer(body) if m[2] == lang]


def commands(block: str) -> list[str]:
    """The block's commands: lines joined until bash parses them whole (continuations, quotes
    over several lines); blank and comment-only lines dropped."""
    found: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if line.endswith("\\"):  # continued (bash would take it as whole at the end of input)
            continue
        if subprocess.run(["bash", "-n", "-c", pending], capture_output=True).returncode == 0:
            found.append(pending.rstrip("\n"))
            pending = ""
    assert not pending, f"an unfinished command: {pending}"
    return found


def long_running(command: str) -> bool:
    return tuple(shlex.split(command, comments=True)[:3]) in LONG_RUNNING


def newcomer_env() -> dict[str, str]:
    """The environment of a new shell: no stack settings, and no `tierpoint` on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPOINT_", "AWS_"))}
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and not Path(d, "tierpoint").exists()
    )
    env.pop("VIRTUAL_ENV", None)
    env.pop("COLUMNS", None)
    return env


@dataclass
class Terminal:
    """One shell session: commands run one by one in `cwd`, each seeing the variables the ones
    before it set (every assignment is exported with `set -a`, as a shell keeps them)."""

    cwd: Path
    env: dict[str, str]
    transcript: list[str] = field(default_factory=list)

    def _argv(self, command: str, env_out: Path) -> list[str]:
        script = 'set -a\neval "$1"\nrc=$?\nenv -0 > "$2"\nexit $rc'
        return ["bash", "-c", script, "_", command, str(env_out)]

    def _take_env(self, env_out: Path) -> None:
        data = env_out.read_bytes().decode()
        self.env = dict(e.split("=", 1) for e in data.split("\0") if "=" in e)

    def run(self, command: str) -> str:
        env_out = self.cwd / ".readme-env"
        result = subprocess.run(
            self._argv(command, env_out),
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        out = result.stdout + result.stderr
        self.transcript.append(f"$ {command}\n{out}")
        assert result.returncode == 0, f"$ {command}\nexit {result.returncode}\n{out[-6000:]}"
        self._take_env(env_out)
        return out

    def start(self, command: str) -> BackgroundCommand:
        env_out = self.cwd / ".readme-env-bg"
        log = self.cwd / ".readme-bg.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self._argv(command, env_out),
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return BackgroundCommand(command, proc, log, env_out)


@dataclass
class BackgroundCommand:
    command: str
    proc: subprocess.Popen[bytes]
    log: Path
    env_out: Path

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Clone:
    root: Path
    dev: subprocess.Popen[bytes]
    dev_log: Path
    data_dir: str = ".tierpoint/dev"

    @property
    def stack_json(self) -> Path:
        return self.root / self.data_dir / "stack.json"


def _clone_like(root: Path) -> None:
    """The repository's files as a clone has them (links to this checkout's: bootstrap.py finds
    its environments through its own resolved path), and its built environments."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for top in sorted({line.split("/", 1)[0] for line in listed.splitlines()}):
        (root / top).symlink_to(ROOT / top)
    for built in (".venv", ".venv-torch", ".bootstrap"):
        if (ROOT / built).exists():
            (root / built).symlink_to(ROOT / built)


@pytest.fixture(scope="module")
def clone() -> Iterator[Clone]:
    # The README's `python3 bootstrap.py dev`.
    yield from _running_clone(["python3", "bootstrap.py", "dev"])


@pytest.fixture
def peer_clone() -> Iterator[Clone]:
    """A clone running the stack that PEER_SECTION starts (its `dev` command as written); only
    for its test, so that it is stopped before the other tests' stack starts."""
    dev = next(c for b in blocks(TRAIN_RESUME, "sh", PEER_SECTION) for c in commands(b))
    argv = shlex.split(dev)
    assert long_running(dev) and "--data-dir" in argv, dev
    yield from _running_clone(argv, data_dir=argv[argv.index("--data-dir") + 1])


def _running_clone(dev_argv: list[str], data_dir: str = ".tierpoint/dev") -> Iterator[Clone]:
    require_torch_venv()
    # Outside pytest's basetemp: the embedded Postgres runs as its own user when we are root.
    root = Path(tempfile.mkdtemp(prefix="tierpoint-readme-"))
    root.chmod(0o755)
    _clone_like(root)
    log = root / ".dev.log"
    with open(log, "wb") as out:
        # On a free port (other stacks may hold 8080).
        dev = subprocess.Popen(
            [*dev_argv, "--port", "0"],
            cwd=root,
            env=newcomer_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = Clone(root, dev, log, data_dir)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not running.stack_json.exists():
            assert dev.poll() is None, f"dev exited {dev.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        yield running
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(TIMEOUT)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _checked(out: str, command: str) -> str:
    bad = BROKEN.search(out)
    assert bad is None, f"$ {command}\nprinted {bad[0]!r}:\n{out[-6000:]}"
    return out


def _latest(clone: Clone, job: str, tier: str | None = None) -> int | None:
    """The step of the job's latest restorable checkpoint (on `tier`), None if there is none."""
    facts = json.loads(clone.stack_json.read_text())
    answer = httpx.get(
        f"{facts['api_url']}/v1/jobs/{job}/checkpoints/latest",
        params={"tier": tier} if tier else {},
        headers={"Authorization": f"Bearer {facts['token']}"},
        timeout=30,
    )
    return int(answer.json()["step"]) if answer.status_code == 200 else None


def _restorable(clone: Clone, job: str, output: str) -> bool:
    """Two checkpoints saved, one of them restorable."""
    return len(SAVED.findall(output)) >= 2 and _latest(clone, job) is not None


# Whether a background command's run may be killed now: (clone, job, its output so far).
Ready = Callable[[Clone, str, str], bool]


def _run_page(
    clone: Clone, page: str, section: str | None = None, ready: Ready = _restorable
) -> list[tuple[str, str]]:
    """Every command of the page (or of its `section`) in one terminal; (command, output) of
    each that ran. A command followed by a `kill` is killed once `ready`."""
    term = Terminal(clone.root, newcomer_env())
    todo = [c for b in blocks(page, "sh", section) for c in commands(b) if not long_running(c)]
    assert todo, page
    ran: list[tuple[str, str]] = []
    i = 0
    while i < len(todo):
        command = todo[i]
        following = todo[i + 1] if i + 1 < len(todo) else ""
        if following.startswith("kill "):
            ran.append((command, _run_until_killed(clone, term, command, following, ready)))
            ran.append((following, ""))
            i += 2
            continue
        ran.append((command, _checked(term.run(command), command)))
        i += 1
    return ran


def _run_until_killed(clone: Clone, term: Terminal, command: str, kill: str, ready: Ready) -> str:
    """`command` in the background; once `ready` (the page kills it "after a few checkpoints"),
    `kill` as written. Every process of the run must be gone then: a rank killed alone takes the
    others down with it (torchrun stops them)."""
    argv = shlex.split(command)
    job = argv[argv.index("--job") + 1] if "--job" in argv else "train-resume-demo"
    bg = term.start(command)
    deadline = time.monotonic() + TIMEOUT
    while not ready(clone, job, bg.output):
        assert bg.proc.poll() is None, f"$ {command}\nended before the kill:\n{bg.output}"
        assert time.monotonic() < deadline, bg.output
        time.sleep(0.2)
    assert bg.proc.poll() is None, f"$ {command}\nended before it was ready to kill:\n{bg.output}"
    pids = (clone.root / ".tierpoint" / f"{job}.pids").read_text().split()
    term.run(kill)
    code = bg.proc.wait(TIMEOUT)
    assert code != 0, f"$ {command}\nwas not killed:\n{bg.output}"
    assert DONE.search(bg.output) is None, bg.output
    # SIGKILL is delivered at once but a rank holding torch's memory takes a moment to unmap it
    # and exit (it shows as running meanwhile): gone means gone within a bound, not instantly.
    for pid in pids:
        gone_by = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(int(pid)):
            assert time.monotonic() < gone_by, f"{pid} still {_state(int(pid))} 30 s after the kill"
            time.sleep(0.1)
    term._take_env(bg.env_out)  # the shell it ran in lives on: `source` there still counts
    return bg.output


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _peer_copy_restorable(clone: Clone, job: str, output: str) -> bool:
    """The newest checkpoint the run saved is restorable on the peer tier (so the restart reads
    that one, from there)."""
    saved = SAVED.findall(output)
    return len(saved) >= 2 and _latest(clone, job, "peer") == int(saved[-1][0])


# Run first: its stack stops before the module's own starts (they would share two cores).
def test_a_lost_nodes_rank_resumes_on_a_spare_node_from_the_peer_copy(
    peer_clone: Clone,
) -> None:
    ran = _run_page(peer_clone, TRAIN_RESUME, PEER_SECTION, _peer_copy_restorable)
    training = [out for cmd, out in ran if "torchrun" in cmd]
    killed, resumed_run, uninterrupted = training
    assert "declared lost" in next(out for cmd, out in ran if "node-lost" in cmd)
    resumed = RESUMED.search(resumed_run)
    assert resumed is not None, resumed_run
    assert dict(SAVED.findall(killed))[resumed[1]] == resumed[2], "not the state saved"
    # Every file came from the peer tier: node-1's from node-2's disk, node-2's from node-3's.
    read = re.search(r"; read (.*?)(;|\))", resumed_run)
    assert read is not None, resumed_run
    files = dict(f.rsplit(" from ", 1) for f in read[1].split(", "))
    assert {".metadata", "__0_0.distcp"} <= set(files), read[1]
    assert set(files.values()) == {"peer"}, read[1]
    # Node-1's files, now on the spare node's local tier.
    kept = peer_clone.root / peer_clone.data_dir / "nodes" / "node-3" / "ssd" / "peer-demo"
    assert (kept / resumed[1]).is_dir(), f"nothing kept on node-3:\n{resumed_run}"
    assert {".metadata", "__0_0.distcp"} <= {p.name for p in (kept / resumed[1]).iterdir()}
    done = [DONE.search(out) for out in (resumed_run, uninterrupted)]
    assert done[0] is not None and done[1] is not None, training
    assert done[0][0] == done[1][0], "the resumed run ended in another state"
    shown = "\n".join(blocks(TRAIN_RESUME, "", PEER_SECTION))
    for line in [*SAVED.finditer(shown), *DONE.finditer(shown)]:
        assert line[0] in "\n".join(training), f"the page shows {line[0]!r}"


def test_the_readme_runs_as_written(clone: Clone) -> None:
    ran = dict(_run_page(clone, "README.md"))
    demo = next(out for cmd, out in ran.items() if cmd.startswith("python3 bootstrap.py demo"))
    assert "step 300" in demo, demo
    restored = [p for p in (clone.root / "restored").rglob("*") if p.is_file()]
    assert restored, "restore wrote nothing"
    status = next(out for cmd, out in ran.items() if cmd.startswith("tierpoint status"))
    assert "demo-1" in status, status


def test_train_resume_runs_as_written_and_resumes_with_the_saved_state(clone: Clone) -> None:
    ran = _run_page(clone, TRAIN_RESUME)
    outputs = "\n".join(out for _, out in ran)
    saved = dict(SAVED.findall(outputs))
    resumed = RESUMED.search(outputs)
    assert resumed is not None, outputs
    assert saved[resumed[1]] == resumed[2], "the resumed state is not the one saved"
    assert DONE.search(outputs), outputs
    # The output the page shows is what a run prints (the digests are deterministic on CPU).
    shown = "\n".join(blocks(TRAIN_RESUME, ""))
    for line in [*SAVED.finditer(shown), *DONE.finditer(shown)]:
        assert line[0] in outputs, f"the page shows {line[0]!r}; the run printed:\n{outputs}"


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
