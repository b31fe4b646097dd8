"""Running a page's shell blocks as a newcomer does (tests/test_readme.py): each command exactly
as written, in a fresh directory laid out like a clone, against the dev stack the page starts.

A page's blocks run in terminals: a block whose first line is `# terminal N ...` runs in terminal
N (a new shell the first time, with no stack settings and no `tierpoint` on PATH; the same shell
after that: variables a command sets or a `source` exports stay), a block without one in the
terminal of the block before it. A command that a `kill` ends before its terminal is used again
(training, which the page kills "after a few checkpoints" from another terminal) runs in the
background until `ready`; the commands of other terminals then run while it does. Only commands
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

from tests.client.torch.ranks import require_torch_venv

ROOT = Path(__file__).resolve().parents[2]
# The section of examples/train_resume/README.md that runs on a stack of its own.
PEER_SECTION = "When a node is lost: resume on a spare node from its peer copy"
# Its commands succeed as written (the run the guard stops ends in a check of the guard's exit
# code), but its four training runs cost more than a minute (the same walk with fewer steps takes
# 60 s here): it runs end to end, exit codes checked, in
# tests/client/torch/test_train_resume_nan.py rather than twice in CI.
NAN_SECTION = (
    "When the loss goes NaN after a resume: the guard, and a rollback to the newest good step"
)
# Commands that run until Ctrl-C (the test runs `dev` itself) or run the whole test suite.
LONG_RUNNING = {("python3", "bootstrap.py", "dev"), ("python3", "bootstrap.py", "test")}
TIMEOUT = 600.0  # per command: a hang guard
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
TERMINAL = re.compile(r"^# terminal (\d+)\b")
# What a first-day command must never print: a missing program, a refused token, a server error.
BROKEN = re.compile(
    r"command not found|No such file or directory|missing_token|invalid_token|Traceback"
    r'|"status":\s*(401|403|5\d\d)'
)
SAVED = re.compile(r"^step (\d+): loss \S+, checkpointing \(state (\w+)\)$", re.M)
DONE = re.compile(r"^done at step \d+ \(state \w+\)$", re.M)
HEADING = re.compile(r"^## (.+)$", re.M)
# The files this harness writes into a clone (the commands' environments and logs).
HARNESS_FILES = {".readme-env", ".readme-env-bg", ".readme-bg.log", ".dev.log"}


def blocks(page: str, lang: str, section: str | None = None) -> list[str]:
    """The page's fenced blocks in `lang`: those of its `## section` only, or (None) those of
    every section but PEER_SECTION, which runs against a stack of its own, and NAN_SECTION."""
    text = (ROOT / page).read_text()
    parts = HEADING.split(text)  # [intro, title, body, title, body, ...]
    titled = [("", parts[0]), *zip(parts[1::2], parts[2::2], strict=True)]
    apart = (PEER_SECTION, NAN_SECTION)
    wanted = [b for t, b in titled if (t == section if section else t not in apart)]
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


@dataclass(frozen=True)
class Step:
    terminal: str
    command: str


def steps(page: str, section: str | None = None) -> list[Step]:
    """The page's (or its section's) shell commands, each with the terminal it runs in."""
    found: list[Step] = []
    terminal = "1"
    for block in blocks(page, "sh", section):
        marker = TERMINAL.match(block.lstrip())
        if marker:
            terminal = marker[1]
        found += [Step(terminal, c) for c in commands(block)]
    return found


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


def clone_like(root: Path) -> None:
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


def running_clone(dev_argv: list[str], data_dir: str = ".tierpoint/dev") -> Iterator[Clone]:
    require_torch_venv()
    # Outside pytest's basetemp: the embedded Postgres runs as its own user when we are root.
    root = Path(tempfile.mkdtemp(prefix="tierpoint-readme-"))
    root.chmod(0o755)
    clone_like(root)
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


def checked(out: str, command: str) -> str:
    bad = BROKEN.search(out)
    assert bad is None, f"$ {command}\nprinted {bad[0]!r}:\n{out[-6000:]}"
    return out


def latest(clone: Clone, job: str, tier: str | None = None) -> int | None:
    """The step of the job's latest restorable checkpoint (on `tier`), None if there is none."""
    facts = json.loads(clone.stack_json.read_text())
    answer = httpx.get(
        f"{facts['api_url']}/v1/jobs/{job}/checkpoints/latest",
        params={"tier": tier} if tier else {},
        headers={"Authorization": f"Bearer {facts['token']}"},
        timeout=30,
    )
    return int(answer.json()["step"]) if answer.status_code == 200 else None


def tier_state(clone: Clone, job: str, step: int, tier: str) -> str | None:
    """The state of the checkpoint's copy on `tier`, None when it has none."""
    facts = json.loads(clone.stack_json.read_text())
    answer = httpx.get(
        f"{facts['api_url']}/v1/jobs/{job}/checkpoints/{step}",
        headers={"Authorization": f"Bearer {facts['token']}"},
        timeout=30,
    )
    answer.raise_for_status()
    states = {t["tier"]: t["state"] for t in answer.json()["tiers"]}
    return states.get(tier)


def restorable(clone: Clone, job: str, output: str) -> bool:
    """Two checkpoints saved, one of them restorable."""
    return len(SAVED.findall(output)) >= 2 and latest(clone, job) is not None


# Whether a background command's run may be killed now: (clone, job, its output so far).
Ready = Callable[[Clone, str, str], bool]


@dataclass
class Killable:
    """A command running in the background of its terminal until a `kill` of the page."""

    command: str
    bg: BackgroundCommand
    term: Terminal
    pids: list[str]


def run_page(
    clone: Clone, page: str, section: str | None = None, ready: Ready = restorable
) -> list[tuple[str, str]]:
    """Every command of the page (or of its `section`), each in its terminal; (command, output)
    of each that ran, a killed one's at its kill."""
    todo = [s for s in steps(page, section) if not long_running(s.command)]
    assert todo, page
    terminals: dict[str, Terminal] = {}
    ran: list[tuple[str, str]] = []
    running: Killable | None = None
    for i, step in enumerate(todo):
        term = terminals.setdefault(step.terminal, Terminal(clone.root, newcomer_env()))
        if step.command.startswith("kill "):
            assert running is not None, f"nothing runs for `{step.command}` to kill"
            term.run(step.command)
            ran += [(running.command, _killed(running)), (step.command, "")]
            running = None
        elif _killed_later(todo, i):
            assert running is None, f"two runs at once: {running.command}, {step.command}"
            running = _start_until_ready(clone, term, step.command, ready)
        else:
            ran.append((step.command, checked(term.run(step.command), step.command)))
    assert running is None, f"never killed: {running.command}"
    return ran


def _killed_later(todo: list[Step], i: int) -> bool:
    """todo[i] runs until a `kill` ends it: the kill's terminal is another, and todo[i] is the
    last command of another terminal before the kill (its terminal is busy until then)."""
    for k in range(i + 1, len(todo)):
        if todo[k].command.startswith("kill "):
            others = [j for j in range(k) if todo[j].terminal != todo[k].terminal]
            return bool(others) and others[-1] == i
        if todo[k].terminal == todo[i].terminal:
            return False
    return False


def _start_until_ready(clone: Clone, term: Terminal, command: str, ready: Ready) -> Killable:
    """`command` in the background of `term`, once `ready` (the page kills it "after a few
    checkpoints")."""
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
    return Killable(command, bg, term, pids)


def _killed(run: Killable) -> str:
    """Every process of the run is gone after the page's kill: a rank killed alone takes the
    others down with it (torchrun stops them). Its output."""
    bg = run.bg
    code = bg.proc.wait(TIMEOUT)
    assert code != 0, f"$ {run.command}\nwas not killed:\n{bg.output}"
    assert DONE.search(bg.output) is None, bg.output
    # SIGKILL is delivered at once, but a rank holding torch's memory takes a while to unmap it
    # and exit (it shows as running meanwhile): waited for, with a hang guard only.
    for pid in run.pids:
        gone_by = time.monotonic() + TIMEOUT
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(int(pid)):
            assert time.monotonic() < gone_by, f"{pid} still {_state(int(pid))} after the kill"
            time.sleep(0.1)
    run.term._take_env(bg.env_out)  # the shell it ran in lives on: `source` there still counts
    return bg.output


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
