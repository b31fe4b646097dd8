"""Where a restore writes: the destination directory, checked before any byte is read; a staging
directory inside it where each shard waits, verified, until every one is; then the commit that
moves them all into place, or the abort that leaves the destination as it was.

So whoever looks into the destination during a restore, or after one that failed or was
interrupted, finds what was there before and at most one hidden `.tierpoint-restore-*` directory
(its files end in `.tierpoint-partial`): never part of a checkpoint under the checkpoint's names,
which a loader globbing the directory would take for the whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tierpoint_client.errors import DestinationError, DestinationNotEmptyError
from tierpoint_client.paths import safe_join

# What a restore does with a destination that already holds entries: refuse it (nothing is
# written), overwrite the checkpoint's files and keep the others, or clean it (remove every entry
# that is not the checkpoint's, once the checkpoint is verified).
Existing = Literal["refuse", "overwrite", "clean"]
EXISTING: tuple[Existing, ...] = ("refuse", "overwrite", "clean")
STAGING_PREFIX = ".tierpoint-restore-"
# How many entries of a destination a refusal names.
SHOWN = 5


def shown(rel: str | os.PathLike[str]) -> str:
    """A name for messages, whatever bytes it holds (a terminal may not take surrogates)."""
    return os.fsencode(rel).decode("utf-8", "replace")


def check_destination(dest_dir: str | os.PathLike[str], existing: Existing) -> None:
    """What can be said of the destination before the checkpoint is known: a directory or
    nothing yet, and (unless told otherwise) empty. Reads only."""
    if existing not in EXISTING:
        raise ValueError(f"existing must be one of {', '.join(EXISTING)}, not {existing!r}")
    path = Path(dest_dir)
    if not os.path.lexists(path):
        return
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DestinationError(f"{shown(path)} is a symlink to nothing") from None
    except OSError as e:
        raise DestinationError(f"cannot use {shown(path)}: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode):
        raise DestinationError(f"{shown(path)} exists and is not a directory")
    if existing == "refuse":
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            raise DestinationError(f"cannot list {shown(path)}: {e.strerror or e}") from None
        # guard: restore-refuses-a-non-empty-dest
        if names:
            raise DestinationNotEmptyError(
                shown(path), [shown(n) for n in names[:SHOWN]], len(names)
            )


@dataclass
class Destination:
    """A destination checked against the checkpoint's paths. `others` are its entries outside
    the checkpoint (kept by "overwrite", removed by "clean"); `in_the_way` those where the
    checkpoint needs another kind of entry (a directory or symlink at a shard's path, a
    non-directory where a shard's directory goes), which only "clean" removes."""

    path: Path
    existing: Existing
    existed: bool
    others: tuple[str, ...] = ()
    in_the_way: tuple[str, ...] = ()
    # Set by begin: the directories made for the destination (deepest first) and the staging one.
    created: tuple[Path, ...] = ()
    staging: Path | None = None

    @classmethod
    def survey(
        cls, dest_dir: str | os.PathLike[str], paths: Sequence[str], existing: Existing
    ) -> Destination:
        """Check the destination for these shard paths; reads only, raises DestinationError
        (or UnsafePathError) when the restore cannot go ahead."""
        check_destination(dest_dir, existing)
        path = Path(dest_dir)
        if not os.path.lexists(path):
            return cls(path, existing, existed=False)
        others, in_the_way = _survey(path, paths)
        if in_the_way and existing != "clean":
            raise DestinationError(
                f"{shown(path / in_the_way[0])} is in the way of the checkpoint's "
                f"{_needs(in_the_way[0], paths)}; cleaning the destination replaces it"
            )
        if existing == "overwrite":
            for p in paths:
                safe_join(path, p)  # a symlink in the destination cannot lead a write elsewhere
        return cls(path, existing, True, tuple(others), tuple(in_the_way))

    def begin(self) -> Path:
        """Make the destination (when it is not there) and the staging directory in it; returns
        the staging directory."""
        try:
            if not self.existed:
                self.created = tuple(_make_dirs(self.path))
            staging = Path(os.path.realpath(self.path)) / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
            staging.mkdir(mode=0o700)
        except OSError as e:
            self._remove_created()
            raise DestinationError(f"cannot write into {shown(self.path)}: {e}") from None
        self.staging = staging
        return staging

    def commit(self, staged: Sequence[tuple[str, Path]]) -> bool:
        """Move every staged file to its path (after removing what "clean" removes), as one step
        that Ctrl-C does not cut in two; True when a Ctrl-C came meanwhile (the caller says so)."""
        assert self.staging is not None
        root = Path(os.path.realpath(self.path))
        moved = 0
        with held_interrupts() as interrupted:
            try:
                if self.existing == "clean":
                    for rel in (*self.in_the_way, *self.others):
                        _remove(root / rel)
                for rel, tmp in staged:
                    final = safe_join(root, rel)
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, final)
                    moved += 1
                self.staging.rmdir()
            except OSError as e:
                with contextlib.suppress(OSError):
                    shutil.rmtree(self.staging)
                raise DestinationError(
                    f"moving the verified files into {shown(self.path)} failed after {moved} of "
                    f"{len(staged)} ({e}): {shown(self.path)} holds part of the checkpoint"
                ) from e
        self.staging = None
        # The renames (and the directories made for them) are durable once their directories are.
        for directory in sorted(_directories(root, (rel for rel, _ in staged)), reverse=True):
            _fsync_dir(directory)
        if self.created:
            _fsync_dir(self.created[-1].parent)
        return bool(interrupted)

    def abort(self) -> str:
        """Remove the staging directory and whatever the restore made; returns what the
        destination holds now. Raises DestinationError when they cannot be removed."""
        with held_interrupts():
            if self.staging is not None:
                # guard: restore-abort-leaves-dest-as-it-was
                try:
                    shutil.rmtree(self.staging)
                except OSError as e:
                    raise DestinationError(
                        f"the partial restore in {shown(self.staging)} could not be removed "
                        f"({e}): remove it; it is not a checkpoint"
                    ) from e
                self.staging = None
            self._remove_created()
        if not self.existed:
            return f"{shown(self.path)} was not created"
        return f"{shown(self.path)} is as it was before the restore"

    def _remove_created(self) -> None:
        for directory in self.created:
            try:
                directory.rmdir()
            except OSError:
                break  # something else is in it now: leave it, and what holds it
        self.created = ()


def _survey(root: Path, paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """(others, in the way) under root for these shard paths, walking only the checkpoint's own
    directories; never follows a symlink."""
    files = set(paths)
    dirs = {p[:i] for p in paths for i, c in enumerate(p) if c == "/"}
    device = os.stat(root).st_dev
    others: list[str] = []
    in_the_way: list[str] = []

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = prefix + entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if rel in files:
                    if is_dir or entry.is_symlink():
                        in_the_way.append(rel)
                elif rel not in dirs:
                    others.append(rel)
                elif not is_dir:
                    in_the_way.append(rel)
                elif entry.stat(follow_symlinks=False).st_dev != device:
                    # The files are renamed into place, which cannot cross a mount point.
                    raise DestinationError(
                        f"{shown(root / rel)} is another file system's mount point: a restore "
                        "renames its files into place, which cannot cross file systems"
                    )
                else:
                    walk(entry.path, rel + "/")

    walk(os.fspath(root), "")
    return sorted(others), sorted(in_the_way)


def _needs(rel: str, paths: Sequence[str]) -> str:
    return f"file {rel!r}" if rel in paths else f"directory {rel!r}"


def _make_dirs(path: Path) -> list[Path]:
    """Make `path` and its missing parents; returns those made, deepest first."""
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    made: list[Path] = []
    try:
        for directory in reversed(missing):
            directory.mkdir()
            made.insert(0, directory)
    except OSError:
        for directory in made:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return made


def _remove(path: Path) -> None:
    """An entry "clean" removes: a directory with all it holds, anything else unlinked (a
    symlink, never what it points to)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _directories(root: Path, rels: Iterable[str]) -> set[Path]:
    """Root and every directory on the paths: each got an entry (a file or a directory)."""
    out = {root}
    for rel in rels:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add(root.joinpath(*parts[:i]))
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT) held off during the block, which it would cut in two; the list says
    whether one came. Where the program set a handler of its own, that handler is called after
    the block; Python's own (KeyboardInterrupt) is left to the caller, which knows what to say.
    Only the main thread can set a handler: elsewhere, and where SIGINT is ignored, nothing
    changes."""
    got: list[int] = []
    previous = signal.getsignal(signal.SIGINT) if _main_thread() else None
    if previous is None or previous is signal.SIG_IGN:
        yield got
        return
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)
    if got and callable(previous) and previous is not signal.default_int_handler:
        previous(signal.SIGINT, None)
        got.clear()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
