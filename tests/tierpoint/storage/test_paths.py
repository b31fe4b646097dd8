from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.properties import examples
from tests.helpers.storage import new_ref
from tierpoint.errors import UnsafePath
from tierpoint.storage.base import RecordedCopy, ShardRef
from tierpoint.storage.paths import validate_name, validate_relative_path
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig, TierKind

BAD_PATHS = [
    "",
    ".",
    "..",
    "../x",
    "a/../../x",
    "a/..",
    "/etc/passwd",
    "a\\b",
    "..\\x",
    "a//b",
    "a/",
    "./a",
    "a/./b",
    "a\x00b",
    "a\nb",
    "x" * 800,
    "a/" + "y" * 256,
    "a/.b.tierpoint-partial",
    "a/.b.tierpoint-deleting",
    "\udcff",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_unsafe_paths_are_refused_with_a_reason(path: str) -> None:
    with pytest.raises(UnsafePath) as err:
        validate_relative_path(path)
    assert str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("path", ["a", "model/rank-0.bin", "a.b/c..d/.hidden", "é/ü.pt", "..a"])
def test_safe_paths_are_returned_unchanged(path: str) -> None:
    assert validate_relative_path(path) == path


@pytest.mark.parametrize("name", ["llama3-70b.run-7", "A", "a" * 128, "x_1"])
def test_job_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "-a", ".a", "a/b", "a" * 129, "a b", "ä"])
def test_bad_job_names(name: str) -> None:
    with pytest.raises(UnsafePath):
        validate_name(name)


components = st.one_of(
    st.sampled_from(["..", ".", "", "a", "b.c", "..x", "x..", "\\", "é"]),
    st.text(alphabet="ab./\\\x00", max_size=6),
)
paths = st.one_of(
    st.lists(components, min_size=1, max_size=6).map("/".join),
    st.text(max_size=40),
)


@given(paths)
def test_any_dotdot_or_absolute_path_is_refused(path: str) -> None:
    if path.startswith("/") or ".." in path.split("/"):
        with pytest.raises(UnsafePath):
            validate_relative_path(path)


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    max_examples=examples(200),
    deadline=None,
)
@given(path=paths)
def test_accepted_paths_resolve_inside_the_root(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    try:
        validate_relative_path(path)
    except UnsafePath:
        return
    assert not path.startswith("/")
    assert ".." not in path.split("/")
    store = PosixStore(TierConfig(name="t", kind=TierKind.SHARED, root=str(root)))
    ref = ShardRef(f"job-{uuid.uuid4().hex[:8]}", 7, path)
    store.write(ref, io.BytesIO(b"x"), 1, None, None)
    real_root = os.path.realpath(root)
    assert os.path.realpath(store.location(ref)).startswith(f"{real_root}/{ref.job}/7/")


@given(st.lists(st.sampled_from(["a", "b", ".."]), min_size=1, max_size=8))
def test_dotdot_anywhere_is_refused(parts: list[str]) -> None:
    path = "/".join(parts)
    if ".." in parts:
        with pytest.raises(UnsafePath):
            validate_relative_path(path)
    else:
        assert validate_relative_path(path) == path


def test_symlinked_shard_pointing_out_of_the_root_is_refused(posix_store: PosixStore) -> None:
    ref = new_ref("evil")
    cp = posix_store.root / ref.job / str(ref.step)
    cp.mkdir(parents=True)
    (cp / "evil").symlink_to("/etc/passwd")
    with pytest.raises(UnsafePath):
        posix_store.open_read(ref)
    with pytest.raises(UnsafePath):
        posix_store.size(ref)
    with pytest.raises(UnsafePath):
        posix_store.verify(ref, 10, "00000000")
    with pytest.raises(UnsafePath):
        posix_store.checksum(ref)
    # Writing over it is refused too, and the target is untouched.
    before = Path("/etc/passwd").read_bytes()
    with pytest.raises(UnsafePath):
        posix_store.write(ref, io.BytesIO(b"x"), 1, None, None)
    assert Path("/etc/passwd").read_bytes() == before


def test_symlinked_directory_out_of_the_root_is_refused(
    posix_store: PosixStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ref = new_ref("dir/shard")
    cp = posix_store.root / ref.job / str(ref.step)
    cp.mkdir(parents=True)
    (cp / "dir").symlink_to(outside)
    with pytest.raises(UnsafePath):
        posix_store.write(ref, io.BytesIO(b"abc"), 3, None, None)
    with pytest.raises(UnsafePath):
        posix_store.open_read(ref)
    assert list(outside.iterdir()) == []


def test_symlinked_job_directory_out_of_the_root_is_refused(
    posix_store: PosixStore, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (posix_store.root / "victim").symlink_to(outside)
    ref = ShardRef("victim", 1, "a/b")
    with pytest.raises(UnsafePath):
        posix_store.write(ref, io.BytesIO(b"abc"), 3, None, None)
    with pytest.raises(UnsafePath):
        posix_store.delete_checkpoint("victim", 1, [RecordedCopy("a/b")])
    assert list(outside.iterdir()) == []


def test_a_symlink_is_refused_even_inside_its_own_checkpoint(posix_store: PosixStore) -> None:
    """No component below the tier root is followed if it is a symlink, wherever it points: a
    job's files never need one (the client refuses to register them), and only that rule is
    the same whether the kernel resolves the path (openat2) or we walk it component by
    component."""
    target = new_ref("real.bin")
    posix_store.write(target, io.BytesIO(b"hello"), 5, None, None)
    link = ShardRef(target.job, target.step, "link.bin")
    Path(posix_store.location(link)).symlink_to("real.bin")
    with pytest.raises(UnsafePath):
        posix_store.open_read(link)
    with pytest.raises(UnsafePath):
        posix_store.checksum(link)


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "a\\b", "", "."])
def test_stores_refuse_unsafe_refs(posix_store: PosixStore, path: str) -> None:
    ref = ShardRef("job", 1, path)
    with pytest.raises(UnsafePath):
        posix_store.write(ref, io.BytesIO(b"x"), 1, None, None)
    with pytest.raises(UnsafePath):
        posix_store.location(ref)
    with pytest.raises(UnsafePath):
        posix_store.delete(ref, None)
    assert list(posix_store.root.iterdir()) == []


def test_bad_job_and_step_are_refused(posix_store: PosixStore) -> None:
    with pytest.raises(UnsafePath):
        posix_store.location(ShardRef("..", 1, "a"))
    with pytest.raises(UnsafePath):
        posix_store.location(ShardRef("job", -1, "a"))
