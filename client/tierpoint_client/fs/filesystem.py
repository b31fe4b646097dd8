"""`TierpointFileSystem`: the `tierpoint://` fsspec protocol, so that a trainer that picks its
checkpoint storage by a folder string (torchtitan's `--checkpoint.folder`, DCP's
`checkpoint_id`) saves to and resumes from tierpoint with no code.

- writes (`tierpoint://<job>/step-<N>/<file>`, opened "wb"): staged on this node's local tier as
  TierpointWriter stages them; the rename to `.metadata` commits and registers the checkpoint
  (_saves);
- reads: the step's fastest verified copy of the file, verified, with fallback (_loads);
- listing: the catalog's restorable checkpoints only, as `step-<N>` folders, so a trainer's
  "latest" is never a half-written step; a step's files once it is restorable;
- `rm -r` of a step: a request to delete it that retention carries out (its rules hold);
- an fsspec transaction (Lightning's save: files opened with `autocommit=False`): its commit puts
  the files in place and registers each step they belong to once, with the files this process
  wrote of it; a discarded transaction leaves nothing (_SaveTransaction).
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem
from fsspec.transaction import Transaction
from fsspec.utils import stringify_path

from tierpoint_client.errors import NotFoundError, TierpointError
from tierpoint_client.fs import _loads, _saves, _shared
from tierpoint_client.fs._config import Settings, client_for
from tierpoint_client.fs._paths import PROTOCOL, FsPath, parse, step_folder, strip
from tierpoint_client.fs._writes import StagedFile
from tierpoint_client.models import Checkpoint
from tierpoint_client.torch._files import METADATA_FILE


def _restorable(cp: Checkpoint) -> bool:
    return cp.quarantine_reason is None and any(t.state == "restorable" for t in cp.tiers)


def _dir(name: str) -> dict[str, Any]:
    return {"name": name, "size": 0, "type": "directory"}


class _SaveTransaction(Transaction):  # type: ignore[misc]
    """A save that is not DCP's has no `.metadata` rename to commit it: Lightning writes its one
    file inside `with fs.transaction:`. The transaction's commit is the save's commit."""

    def complete(self, commit: bool = True) -> None:
        fs = self.fs
        saves = {id(f.owner): f.owner for f in self.files if isinstance(f, StagedFile)}
        try:
            super().complete(commit)
        except BaseException:
            for save in saves.values():
                _saves.abandon(save)
            raise
        for save in saves.values():
            # guard: fs-transaction-discard-registers-nothing
            if commit:
                _saves.commit_written(client_for(fs.settings), save)
            else:
                _saves.abandon(save)


class TierpointFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = (PROTOCOL,)
    transaction_type = _SaveTransaction

    def __init__(self, *args: Any, **storage_options: Any) -> None:
        super().__init__(*args, **storage_options)
        self.settings = Settings.of(storage_options)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return strip(stringify_path(path))

    # -- reading the catalog ---------------------------------------------------------------

    # A trainer's ranks probe alike (torchtitan's resume, every rank): the coordinator asks the
    # catalog and the other ranks take its answers (_shared), so every rank resumes the same step
    # and a resume costs the API the same at any world size.

    def _checkpoint(self, job: str, step: int, *, shared: bool = True) -> Checkpoint | None:
        def ask() -> Checkpoint | None:
            try:
                cp = client_for(self.settings).checkpoint(job, step)
            except NotFoundError:
                return None
            return cp if _restorable(cp) else None

        return _shared.once(f"checkpoint/{job}/{step}", ask)[0] if shared else ask()

    def _steps(self, job: str) -> list[int]:
        def ask() -> list[int]:
            try:
                listed = client_for(self.settings).checkpoints(job, state="restorable")
                return sorted(cp.step for cp in listed if _restorable(cp))
            except NotFoundError:
                return []

        return _shared.once(f"steps/{job}", ask)[0]

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        p = parse(self._strip_protocol(path))
        if not p.job:
            raise TierpointError("tierpoint:// lists one job at a time: tierpoint://<job>")
        if p.step is None:
            steps = self._steps(p.job)
            if not steps:
                raise FileNotFoundError(path)
            entries = [_dir(f"{p.job}/{step_folder(s)}") for s in steps]
        else:
            entries = [self.info(path)] if p.file is not None else self._files(p)
        return entries if detail else [e["name"] for e in entries]

    def _files(self, p: FsPath) -> list[dict[str, Any]]:
        assert p.step is not None
        cp = self._checkpoint(p.job, p.step)
        if cp is None:
            raise FileNotFoundError(p.name)
        out: dict[str, dict[str, Any]] = {}
        for shard in cp.shards or ():
            head, _, rest = shard.path.partition("/")
            name = f"{p.name}/{head}"
            if rest:
                out.setdefault(name, _dir(name))
            else:
                out[name] = {"name": name, "size": shard.size, "type": "file"}
        return sorted(out.values(), key=lambda e: str(e["name"]))

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        p = parse(self._strip_protocol(path))
        if not p.job:
            return _dir("")
        if p.step is None:
            if not self._steps(p.job):
                raise FileNotFoundError(path)
            return _dir(p.job)
        if p.file is not None and _saves.saving(p.job, p.step) is not None:
            # A step being written has no committed file yet (DCP asks for `.metadata`).
            raise FileNotFoundError(path)
        cp = self._checkpoint(p.job, p.step)
        if cp is None:
            raise FileNotFoundError(path)
        if p.file is None:
            return _dir(p.name)
        for shard in cp.shards or ():
            if shard.path == p.file:
                return {"name": p.name, "size": shard.size, "type": "file"}
            if shard.path.startswith(p.file + "/"):
                return _dir(p.name)
        raise FileNotFoundError(path)

    # fsspec's own answer False on any error: an unreachable API or a refused token would read
    # as "no checkpoint", and a trainer would start afresh instead of resuming. Only "not there"
    # is False here.
    def exists(self, path: Any, **kwargs: Any) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: Any) -> bool:
        try:
            return bool(self.info(path)["type"] == "directory")
        except FileNotFoundError:
            return False

    def isfile(self, path: Any) -> bool:
        try:
            return bool(self.info(path)["type"] == "file")
        except FileNotFoundError:
            return False

    # -- writing ---------------------------------------------------------------------------

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        p = parse(self._strip_protocol(path))
        if p.step is not None:
            _saves.begin(self.settings, p)

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        self.makedirs(path, exist_ok=True)

    def _open(
        self,
        path: Any,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> Any:
        p = parse(self._strip_protocol(path))
        if p.step is None or p.file is None:
            raise IsADirectoryError(f"{path}: a file is tierpoint://<job>/step-<N>/<file>")
        if mode == "rb":
            return _loads.open_file(self.settings, p.job, p.step, p.file)
        if mode not in ("wb", "xb"):
            raise NotImplementedError(f"tierpoint:// opens files 'rb' or 'wb', not {mode!r}")
        save = _saves.begin(self.settings, p)
        final = save.directory / p.file
        final.parent.mkdir(parents=True, exist_ok=True)
        recorder = _saves.on_written(save, p.file)
        return StagedFile(final, recorder, autocommit=autocommit, owner=save)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, **kwargs: Any) -> None:
        src = parse(self._strip_protocol(path1))
        dst = parse(self._strip_protocol(path2))
        save = _saves.saving(src.job, src.step) if src.step is not None else None
        if save is None or src.file is None or dst.file is None or src.folder() != dst.folder():
            raise PermissionError(
                f"{path1} -> {path2}: tierpoint:// renames only a file of a step being written "
                "within that step (a committed checkpoint does not change)"
            )
        if dst.file != METADATA_FILE and dst.file.endswith(METADATA_FILE):
            # DCP without collectives: each rank its own metadata, and no one commit.
            raise TierpointError(
                f"{path2}: a DCP save without collectives writes per-rank metadata, which "
                "tierpoint cannot register as one checkpoint; save with a process group"
            )
        _saves.rename(self.settings, save, src.file, dst.file)

    rename = mv

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        for one in path if isinstance(path, list) else [path]:
            self._rm(parse(self._strip_protocol(one)), one)

    def _rm(self, p: FsPath, shown: Any) -> None:
        if p.step is None:
            raise PermissionError(f"{shown}: tierpoint:// deletes one step at a time")
        save = _saves.saving(p.job, p.step)
        if p.file is not None:
            if save is None:
                raise PermissionError(
                    f"{shown}: a committed checkpoint's files are deleted with their step: "
                    f"rm -r tierpoint://{p.job}/{step_folder(p.step)}"
                )
            _saves.remove(save, p.file)
            return
        # The coordinator's own question (torchtitan purges from rank 0 alone): not shared.
        if self._checkpoint(p.job, p.step, shared=False) is None:
            raise FileNotFoundError(shown)
        client_for(self.settings).purge(p.job, p.step)

    def rm_file(self, path: Any) -> None:
        self.rm(path)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        raise PermissionError("tierpoint:// does not copy files: save the state again")
