"""Path rules shared with the server, and confinement of restore targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tierpoint_client import UnsafePathError, safe_join, validate_relative_path
from tierpoint_client.errors import ManifestError
from tierpoint_client.paths import (
    MAX_PART_BYTES,
    MAX_PATH_BYTES,
    check_no_path_conflict,
    partial_name,
)

from tests.helpers.properties import examples
from tierpoint.manifest_parse import parse_manifest_json
from tierpoint.storage.paths import is_partial_name
from tierpoint.storage.paths import partial_name as servers


@pytest.mark.parametrize("path", ["a", "a/b/c.bin", "rank-0.pt", "x..y", ".hidden", "a/.b"])
def test_clean_paths_pass(path: str) -> None:
    assert validate_relative_path(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/..",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "a\\b",
        "a\x00b",
        "a\x1fb",
        "bad\udc80name",
        "shard.bin.tierpoint-partial",
        "shard.bin.tierpoint-deleting",
        "x" * 256,
        "/".join(["abcdefgh"] * 200),
    ],
)
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(UnsafePathError):
        validate_relative_path(path)


def test_safe_join_stays_inside(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "a/b.bin") == tmp_path.resolve() / "a" / "b.bin"
    with pytest.raises(UnsafePathError):
        safe_join(tmp_path, "../escape")


def test_safe_join_refuses_symlinked_directories_leading_out(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        safe_join(dest, "sub/shard.bin")
    (dest / "file.bin").symlink_to(outside / "target")
    with pytest.raises(UnsafePathError, match="symlink"):
        safe_join(dest, "file.bin")


# Characters the rules decide on, and characters that URLs, S3 and shells treat specially.
_EDGES = [*"ab./\\%?#+ ;~*\x00\x1f\x7f", "\u00e9", "e\u0301", "\U0001f642", "\ud800"]
_EDGES.extend([".tierpoint-partial", ".tierpoint-deleting"])
names = st.one_of(
    st.lists(st.sampled_from(_EDGES), max_size=12).map("".join),
    st.text(max_size=40),
    # Around the byte limits of a component and of a whole path.
    st.builds(
        lambda unit, n, sep: sep.join([unit * n] * 4),
        st.sampled_from(["x", "\u00e9", "\U0001f642"]),
        st.integers(MAX_PART_BYTES // 4 - 2, MAX_PART_BYTES + 2),
        st.sampled_from(["", "/"]),
    ),
)


def _registration_accepts(paths: list[str]) -> tuple[bool, set[str]]:
    """Whether the API's manifest parsing accepts shards at `paths`, and its error codes."""
    shards = [{"path": p, "size": 1, "node": "node-a"} for p in paths]
    try:
        parse_manifest_json(json.dumps({"step": 1, "shards": shards}).encode())
    except ValidationError as exc:
        return False, {e["type"] for e in exc.errors()}
    return True, set()


@settings(max_examples=examples(600), deadline=None)
@given(name=names)
def test_the_client_and_the_server_accept_the_same_shard_paths(name: str) -> None:
    """One rule on both sides: what the client's manifest builder lets through, registration
    accepts, and what it refuses the API refuses as an unsafe path."""
    try:
        validate_relative_path(name)
    except UnsafePathError:
        client_ok = False
    else:
        client_ok = True
    server_ok, codes = _registration_accepts([name])
    assert client_ok == server_ok, (name, codes)
    if not server_ok and name.encode("utf-8", "surrogatepass") == name.encode("utf-8", "replace"):
        assert codes == {"unsafe_path"}, (name, codes)
    assert len(name.encode("utf-8", "replace")) <= MAX_PATH_BYTES or not server_ok


@settings(max_examples=examples(300), deadline=None)
@given(paths=st.lists(st.lists(st.sampled_from("ab"), min_size=1, max_size=3), max_size=5))
def test_the_client_and_the_server_refuse_the_same_file_and_directory_pairs(
    paths: list[list[str]],
) -> None:
    """`a` beside `a/b` (one a file, the other under it as a directory) fails on both sides."""
    joined = list(dict.fromkeys("/".join(parts) for parts in paths)) or ["a"]
    try:
        check_no_path_conflict(joined)
    except ManifestError:
        client_ok = False
    else:
        client_ok = True
    server_ok, codes = _registration_accepts(joined)
    assert client_ok == server_ok, (joined, codes)
    assert server_ok or codes == {"path_conflict"}


@settings(max_examples=examples(300), deadline=None)
@given(
    size=st.integers(1, MAX_PART_BYTES),
    char=st.sampled_from(["a", "\u00e9", "\u4e2d", "\U0001f642"]),
    tag=st.sampled_from(["", "0123456789ab"]),
)
def test_every_accepted_name_has_a_temp_name_a_file_system_takes(
    tmp_path_factory: pytest.TempPathFactory, size: int, char: str, tag: str
) -> None:
    """A name of any size the server accepts (up to 255 bytes, in characters of 1 to 4 bytes)
    has a temp name that fits a POSIX name, is ours by its shape, and (without a tag) is the
    server's stores' own."""
    wide = char * (size // len(char.encode()))
    name = wide + "a" * (size - len(wide.encode()))
    assert len(name.encode()) == size
    temp = partial_name(name, tag)
    assert len(temp.encode()) <= MAX_PART_BYTES and "/" not in temp
    assert is_partial_name(temp) and temp != name
    assert partial_name(name) == servers(name)
    directory = tmp_path_factory.mktemp("temp-names")
    (directory / temp).write_bytes(b"x")  # the file system takes it
