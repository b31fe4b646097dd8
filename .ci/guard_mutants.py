#!/usr/bin/env python3
"""Guard mutation check: every safety guard, broken by hand one at a time, must fail a test.

Each mutant (in guard_mutant_table.py) names a guard by its marker, a comment line
`# guard: <id>` right above the guarded line in whatever file it lives in, and gives a replacement
that breaks it, plus the tests that should notice. The check copies the working tree (tracked and
untracked, not ignored, files) into a scratch directory, applies one mutant there, runs only its
tests with the repository's own .venv (cwd, PYTHONPATH and rootdir all point at the scratch copy,
so the mutated modules are the ones imported), and puts the file back. It exits non-zero when a
mutant survives (1; a mutant marked as a known survivor, with its reason, is run and reported but
does not count), or when the table and the source disagree (2): a marker missing, found twice or
naming no mutant, a snippet not found exactly once in its guarded lines, a test file or test that
does not exist, a mutant that does not compile.

    python3 .ci/guard_mutants.py                 # every mutant
    python3 .ci/guard_mutants.py --list          # the table, with where each guard is now
    python3 .ci/guard_mutants.py --only ID ...   # some of them
    python3 .ci/guard_mutants.py --baseline      # first run the selected tests unmutated

Code moves freely: the marker moves with its guard. Editing a guarded line means editing its
mutant's `original`, which the check says by the mutant's id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# The table lives beside this script (its directory is first on sys.path when run).
from guard_mutant_table import MUTANTS, Mutant

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The repository's own (unmutated) copy: only to start the servers the runs share.
from apps.devstack.services import EmbeddedPostgres, MotoS3Server  # noqa: E402

# Only a guard against a hang: a mutant that makes its tests hang counts as killed (timeout).
RUN_TIMEOUT = 300.0
# Hypothesis: a fixed seed and a modest example count, so a run decides the same way each time.
HYPOTHESIS_SEED = "0"
RETENTION_EXAMPLES = "200"
# Three at once: a mutant's run waits on its servers (Postgres, Temporal, the S3 endpoint) and
# subprocesses much of the time. Measured: 8 CPU-seconds per mutant (6 mutants, one at a time,
# 49 s of CPU in all), where two at once took 11 s of wall time each on two cores, so two left
# about a quarter of the machine idle.
JOBS = int(os.environ.get("TIERPOINT_MUTANT_JOBS", "3"))


def _git_files(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (repo / p).is_file()})


# A marker: a comment line of its own, right above the guarded line.
MARKER = re.compile(r"^[ \t]*# guard: (\S+)[ \t]*$")
# Where guards may live: the project's code, not its tests nor this check.
NOT_SEARCHED = (".ci/", "tests/")


@dataclass(frozen=True)
class Site:
    """Where a mutant's marker is: the file and the line (1-based) of the marker."""

    path: str
    line: int


def _markers(repo: Path) -> tuple[dict[str, list[Site]], dict[str, str]]:
    """Every marker in the project's Python files: id -> its sites, and path -> source."""
    sites: dict[str, list[Site]] = {}
    sources: dict[str, str] = {}
    for rel in _git_files(repo):
        if not rel.endswith(".py") or rel.startswith(NOT_SEARCHED):
            continue
        source = (repo / rel).read_text()
        if "# guard: " not in source:
            continue
        sources[rel] = source
        for n, line in enumerate(source.splitlines(), 1):
            if found := MARKER.match(line):
                sites.setdefault(found.group(1), []).append(Site(rel, n))
    return sites, sources


def _mutated(source: str, m: Mutant) -> str:
    """The source with the mutant applied in its guarded lines, every marker line dropped (they
    are comments: dropping them changes nothing else). ValueError when its `original` is not
    found exactly once there."""
    kept: list[str] = []
    at = None
    for line in source.splitlines(keepends=True):
        found = MARKER.match(line)
        if found is None:
            kept.append(line)
        elif found.group(1) == m.id:
            at = len(kept)
    if at is None:
        raise ValueError("no marker")
    span = m.original.rstrip("\n").count("\n") + 1
    region = "".join(kept[at : at + span])
    n = region.count(m.original)
    if n != 1:
        raise ValueError(f"its snippet occurs {n} times in the {span} line(s) below its marker")
    return "".join([*kept[:at], region.replace(m.original, m.replacement, 1), *kept[at + span :]])


def _table_errors(mutants: list[Mutant], repo: Path) -> tuple[list[str], dict[str, Site]]:
    """What is wrong with the table against the source, and where each selected mutant is."""
    errors = []
    ids = [m.id for m in MUTANTS]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        errors.append(f"{dup}: id used more than once")
    sites, sources = _markers(repo)
    for mid in sorted(set(sites) - set(ids)):
        where = ", ".join(f"{s.path}:{s.line}" for s in sites[mid])
        errors.append(f"{mid}: a marker ({where}) that names no mutant of the table")
    found: dict[str, Site] = {}
    for m in mutants:
        here = sites.get(m.id, [])
        if len(here) != 1:
            where = ", ".join(f"{s.path}:{s.line}" for s in here)
            what = f"found {len(here)} times ({where})" if here else "missing"
            errors.append(f"{m.id}: its marker `# guard: {m.id}` is {what}, not once")
            continue
        site = found[m.id] = here[0]
        try:
            compile(_mutated(sources[site.path], m), site.path, "exec")
        except ValueError as exc:
            errors.append(f"{m.id}: {exc} ({site.path}:{site.line})")
        except SyntaxError as exc:
            errors.append(f"{m.id}: the mutated {site.path} does not compile: {exc}")
        for t in m.tests:
            test_file = t.split("::", 1)[0]
            if not (repo / test_file).is_file():
                errors.append(f"{m.id}: test file {test_file} does not exist")
            elif "::" in t:
                name = t.split("::")[-1].split("[", 1)[0]
                if not re.search(rf"def {re.escape(name)}\(", (repo / test_file).read_text()):
                    errors.append(f"{m.id}: no test {name} in {test_file}")
    return errors, found


def _copy_tree(repo: Path, scratch: Path) -> None:
    for rel in _git_files(repo):
        dst = scratch / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dst, follow_symlinks=False)
    # The torch and trainer tests run their processes with the repository's torch and trainers
    # venvs, found beside the tests (ignored by git, so not copied); PYTHONPATH still points them
    # at the scratch copy's client.
    for name in (".venv-torch", ".venv-trainers"):
        if (repo / name).is_dir():
            (scratch / name).symlink_to(repo / name, target_is_directory=True)


# Postgres and the S3 endpoint, started once for every mutant's run (each run still makes its own
# databases and buckets); Temporal is not shared: the runs reuse the test modules' namespaces.
SHARED: dict[str, str] = {}


def _start_shared_services(stack: contextlib.ExitStack) -> None:
    if "TIERPOINT_TEST_DATABASE_URL" not in os.environ:
        pg_root = Path(tempfile.mkdtemp(prefix="tierpoint-mutants-pg-"))
        stack.callback(shutil.rmtree, pg_root, ignore_errors=True)
        pg_root.chmod(0o755)
        pg = EmbeddedPostgres(pg_root / "data", database="postgres")
        pg.start()
        stack.callback(pg.stop)
        SHARED["TIERPOINT_TEST_DATABASE_URL"] = pg.url
    if "TIERPOINT_TEST_S3_ENDPOINT_URL" not in os.environ:
        moto = MotoS3Server()
        SHARED["TIERPOINT_TEST_S3_ENDPOINT_URL"] = moto.start()
        stack.callback(moto.stop)
        SHARED["AWS_ACCESS_KEY_ID"] = moto.access_key_id
        SHARED["AWS_SECRET_ACCESS_KEY"] = moto.secret_access_key
        SHARED["AWS_DEFAULT_REGION"] = moto.region


def _env(scratch: Path) -> dict[str, str]:
    env = {**os.environ, **SHARED}
    # The client distribution too (installed editable from the repository): the path rule and the
    # restore's guards live there.
    env["PYTHONPATH"] = os.pathsep.join([str(scratch), str(scratch / "client")])
    # Restoring a file within the second it was mutated, at the same size, would let a stale
    # .pyc of the mutant be used: no bytecode files at all.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TIERPOINT_RETENTION_EXAMPLES"] = RETENTION_EXAMPLES
    env.pop("TIERPOINT_RECORD_HISTORY", None)
    return env


def _check_imports(python: Path, scratch: Path) -> None:
    """The scratch copy's modules, not the repository's, are what the tests import."""
    probe = (
        "import activities, api, tests, tierpoint, tierpoint_client, workflows; "
        "print('\\n'.join(m.__file__ for m in "
        "(activities, api, tests, tierpoint, tierpoint_client, workflows)))"
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


def _pytest_args(scratch: Path, tests: tuple[str, ...]) -> list[str]:
    return [
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        # The suite's own --durations report is noise in a mutant's output.
        "--durations=0",
        "--durations-min=1000000",
        "--rootdir",
        str(scratch),
        "-c",
        str(scratch / "pyproject.toml"),
        f"--hypothesis-seed={HYPOTHESIS_SEED}",
        *tests,
    ]


class Runner:
    """One scratch copy of the tree and its zygote (mutant_zygote.py): a process that imported
    the suite's libraries once and forks a pytest per mutant."""

    def __init__(self, python: Path, scratch: Path) -> None:
        self.scratch = scratch
        self.proc = subprocess.Popen(
            [str(python), str(Path(__file__).with_name("mutant_zygote.py"))],
            cwd=scratch,
            env=_env(scratch),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            sys.exit("guard mutants: the zygote did not start (its error is above)")

    def pytest(self, tests: tuple[str, ...]) -> tuple[int | None, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        shutil.rmtree(self.scratch / ".hypothesis", ignore_errors=True)
        out = self.scratch / ".mutant-output"
        request = {
            "args": _pytest_args(self.scratch, tests),
            "out": str(out),
            "timeout": RUN_TIMEOUT,
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            sys.exit("guard mutants: the zygote died")
        rc = json.loads(answer)["rc"]
        return rc, out.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ", 1)[0]
    return ""


Row = tuple[str, str, str, str, float, str]


def _drain(
    runner: Runner, todo: queue.SimpleQueue[Mutant], sites: dict[str, Site]
) -> tuple[bool, list[Row]]:
    """Run mutants off the queue in this runner's scratch copy until it is empty; (False, ...)
    when pytest ended in a way that says the table or the suite is broken, not the guard."""
    rows: list[Row] = []
    while True:
        try:
            m = todo.get_nowait()
        except queue.Empty:
            return True, rows
        path = sites[m.id].path
        target = runner.scratch / path
        original = target.read_text()
        target.write_text(_mutated(original, m))
        t0 = time.monotonic()
        try:
            rc, out = runner.pytest(m.tests)
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
            return False, rows
        rows.append((m.id, path, " ".join(m.tests), result, secs, by))
        print(f"{m.id:36} {path:36} {result:8} {secs:6.1f} s  {by or m.why}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument(
        "--baseline", action="store_true", help="run the selected tests unmutated first"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help=f"mutants run at once, each in its own scratch copy (default {JOBS})",
    )
    args = parser.parse_args()

    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.id for m in MUTANTS}
        if unknown:
            parser.error(f"unknown mutant ids: {', '.join(sorted(unknown))}")
        mutants = [m for m in MUTANTS if m.id in args.only]
    errors, sites = _table_errors(mutants, REPO)
    if args.list:
        for m in mutants:
            site = sites.get(m.id)
            where = f"{site.path}:{site.line}" if site else "?"
            print(f"{m.id:36} {where:44} {' '.join(m.tests)}\n{'':36} {m.why}")
    if errors:
        print("guard mutants: the table does not match the source:", *errors, sep="\n  ")
        return 2
    if args.list:
        return 0
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        print(f"guard mutants: {python.relative_to(REPO)} is missing (python3 bootstrap.py test)")
        return 2

    started = time.monotonic()
    jobs = max(1, min(args.jobs, len(mutants)))
    scratches = [Path(tempfile.mkdtemp(prefix="tierpoint-mutants-")) for _ in range(jobs)]
    runners: list[Runner] = []
    rows: list[Row] = []
    shared = contextlib.ExitStack()
    try:
        _start_shared_services(shared)
        for scratch in scratches:
            _copy_tree(REPO, scratch)
            _check_imports(python, scratch)
            runners.append(Runner(python, scratch))
        if args.baseline:
            union = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            t0 = time.monotonic()
            rc, out = runners[0].pytest(union)
            print(f"baseline: {len(union)} test selections, rc={rc}, {time.monotonic() - t0:.0f} s")
            if rc != 0:
                print(out[-4000:])
                print("guard mutants: the tests fail without any mutant")
                return 2
        todo: queue.SimpleQueue[Mutant] = queue.SimpleQueue()
        for m in mutants:
            todo.put(m)
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda r: _drain(r, todo, sites), runners))
        for ok, got in results:
            rows.extend(got)
            if not ok:
                return 2
    finally:
        for runner in runners:
            runner.close()
        shared.close()
        for scratch in scratches:
            if args.keep:
                print(f"scratch copy kept at {scratch}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
    order = {m.id: i for i, m in enumerate(mutants)}
    rows.sort(key=lambda r: order[r[0]])

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
