"""Restoring a plan from POSIX and S3 sources, without the API: bytes, verification, atomicity."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import boto3
import crc32c
import pytest
from tierpoint_client import (
    ChecksumMismatchError,
    DestinationError,
    NoVerifiedCopyError,
    PlanEntry,
    TierInfo,
    UnsafePathError,
)
from tierpoint_client.restore import SourceError, restore_plan

from tests.helpers.services import Services, make_bucket


def _entry(
    path: str, data: bytes, location: str, kind: str = "shared", obj: tuple[str, str] | None = None
) -> PlanEntry:
    bucket, key = obj or (None, None)
    return PlanEntry(
        path=path,
        size=len(data),
        crc32c=f"{crc32c.crc32c(data):08x}",
        tier="lustre" if kind == "shared" else kind,
        kind=kind,
        node=None,
        location=location,
        bucket=bucket,
        key=key,
    )


def _s3_entry(path: str, data: bytes, bucket: str, key: str) -> PlanEntry:
    return _entry(path, data, f"s3://{bucket}/{key}", kind="s3", obj=(bucket, key))


def _posix_plan(src: Path, shards: dict[str, bytes]) -> list[PlanEntry]:
    plan = []
    for rel, data in shards.items():
        f = src / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        plan.append(_entry(rel, data, str(f)))
    return plan


def _files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_posix_restore_copies_bytes_and_reports_progress(tmp_path: Path) -> None:
    shards = {"a.bin": os.urandom(5_000_000), "d/e/f.bin": os.urandom(1234), "empty": b""}
    plan = _posix_plan(tmp_path / "src", shards)
    seen: list[tuple[int, int]] = []
    files = restore_plan(
        plan, tmp_path / "dest", {}, workers=3, progress=lambda d, t: seen.append((d, t))
    ).files
    assert _files_under(tmp_path / "dest") == shards
    assert [f.path for f in files] == list(shards)
    total = sum(map(len, shards.values()))
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("corruption", ["flip", "truncate", "grow"])
def test_mismatch_raises_and_leaves_no_final_file(tmp_path: Path, corruption: str) -> None:
    good = os.urandom(100_000)
    plan = _posix_plan(tmp_path / "src", {"bad/shard.bin": good})
    src = Path(plan[0].location)
    if corruption == "flip":
        data = bytearray(good)
        data[4242] ^= 0x01
        src.write_bytes(bytes(data))
    elif corruption == "truncate":
        src.write_bytes(good[:-1])
    else:
        src.write_bytes(good + os.urandom(10_000_000))
    dest = tmp_path / "dest"
    with pytest.raises(NoVerifiedCopyError) as info:
        restore_plan(plan, dest, {}, workers=1)
    assert info.value.path == "bad/shard.bin"
    (tried,) = info.value.tried
    assert "failed verification" in tried, tried
    mismatch = info.value.__cause__
    assert isinstance(mismatch, ChecksumMismatchError)
    assert mismatch.expected_crc32c == plan[0].crc32c
    # Neither the final name nor a temporary file is left behind: the restore made the
    # destination, and removed it again.
    assert not dest.exists()


def test_mismatch_in_a_parallel_restore_raises(tmp_path: Path) -> None:
    shards = {f"s{i}.bin": os.urandom(50_000) for i in range(8)}
    plan = _posix_plan(tmp_path / "src", shards)
    Path(plan[5].location).write_bytes(os.urandom(50_000))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(NoVerifiedCopyError, match=r"s5\.bin"):
        restore_plan(plan, dest, {}, workers=4)
    # All or nothing: the seven good shards are not left to look like a checkpoint.
    assert list(dest.iterdir()) == []


def test_restore_overwrites_an_existing_file_when_told(tmp_path: Path) -> None:
    plan = _posix_plan(tmp_path / "src", {"x.bin": b"new bytes"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x.bin").write_bytes(b"old")
    restored = restore_plan(plan, dest, {}, existing="overwrite")
    assert (dest / "x.bin").read_bytes() == b"new bytes"
    assert restored.kept == restored.removed == ()


@pytest.mark.parametrize("bad", ["../escape.bin", "/abs.bin", "a/../../b", "a\\b"])
def test_plan_paths_outside_dest_are_refused_before_writing(tmp_path: Path, bad: str) -> None:
    plan = _posix_plan(tmp_path / "src", {"ok.bin": b"fine"})
    plan.append(_entry(bad, b"evil", plan[0].location))
    dest = tmp_path / "dest"
    with pytest.raises(UnsafePathError):
        restore_plan(plan, dest, {})
    assert not (tmp_path / "escape.bin").exists()
    assert _files_under(dest) == {}


@pytest.mark.parametrize("existing", ["overwrite", "clean"])
def test_symlink_in_dest_cannot_redirect_a_write(tmp_path: Path, existing: str) -> None:
    """A symlink where the checkpoint has a directory is in the way: refused when the restore
    only overwrites, removed (the link, never what it points to) when it cleans."""
    plan = _posix_plan(tmp_path / "src", {"sub/shard.bin": b"data"})
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs.bin").write_bytes(b"not ours")
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    if existing == "overwrite":
        with pytest.raises(DestinationError, match="in the way"):
            restore_plan(plan, dest, {}, existing="overwrite")
        assert (dest / "sub").is_symlink()
    else:
        restored = restore_plan(plan, dest, {}, existing="clean")
        assert restored.removed == ("sub",)
        assert not (dest / "sub").is_symlink()
        assert _files_under(dest) == {"sub/shard.bin": b"data"}
    assert [p.name for p in outside.iterdir()] == ["theirs.bin"]


def test_missing_source_without_another_copy_says_so(tmp_path: Path) -> None:
    plan = [_entry("a.bin", b"abc", str(tmp_path / "gone.bin"))]
    with pytest.raises(NoVerifiedCopyError, match="does not exist") as info:
        restore_plan(plan, tmp_path / "dest", {})
    assert isinstance(info.value.__cause__, SourceError)
    assert not (tmp_path / "dest").exists()


class S3Objects(NamedTuple):
    s3: Any
    bucket: str
    prefix: str  # of the objects' keys
    plan: list[PlanEntry]
    tiers: dict[str, TierInfo]


def s3_objects(services: Services, shards: dict[str, bytes], tier_prefix: str) -> S3Objects:
    """The shards as objects in a new bucket under the s3 tier's `tier_prefix`, with their plan."""
    bucket = make_bucket(services)
    s3 = boto3.client("s3", endpoint_url=services.s3_endpoint_url, region_name=services.s3_region)
    prefix = f"{tier_prefix}job-{uuid.uuid4().hex[:8]}/3/"
    plan = []
    for rel, data in shards.items():
        s3.put_object(Bucket=bucket, Key=prefix + rel, Body=data)
        plan.append(_s3_entry(rel, data, bucket, prefix + rel))
    tier = TierInfo(
        name="s3",
        kind="s3",
        root=None,
        bucket=bucket,
        prefix=tier_prefix,
        endpoint_url=services.s3_endpoint_url,
        region=services.s3_region,
    )
    return S3Objects(s3, bucket, prefix, plan, {"s3": tier})


def test_s3_restore_reads_with_tier_endpoint(tmp_path: Path, services: Services) -> None:
    shards = {"r0.bin": os.urandom(3_000_000), "nested/r1.bin": os.urandom(10)}
    s3, bucket, prefix, plan, tiers = s3_objects(services, shards, "pfx/")
    restore_plan(plan, tmp_path / "dest", tiers, workers=2)
    assert _files_under(tmp_path / "dest") == shards

    # A corrupted object fails verification like a corrupted file.
    s3.put_object(Bucket=bucket, Key=prefix + "r0.bin", Body=b"x" + shards["r0.bin"][1:])
    with pytest.raises(NoVerifiedCopyError, match="failed verification"):
        restore_plan(plan[:1], tmp_path / "dest2", tiers)
    assert _files_under(tmp_path / "dest2") == {}

    # A copy on a tier the API did not list cannot be read: that copy's error, named, when no
    # other copy is left (a node reads the copies it can before it needs the ones it cannot).
    with pytest.raises(NoVerifiedCopyError, match="GET /v1/tiers lacks"):
        restore_plan(plan, tmp_path / "dest3", {})

    # A plan pointing outside the tier's bucket or prefix is not followed.
    other = make_bucket(services)
    s3.put_object(Bucket=other, Key=prefix + "r0.bin", Body=shards["r0.bin"])
    stray = [_s3_entry("r0.bin", shards["r0.bin"], other, f"{prefix}r0.bin")]
    stray.append(_s3_entry("r1.bin", b"", bucket, "elsewhere/r1.bin"))
    for entry in stray:
        with pytest.raises(NoVerifiedCopyError, match="outside tier"):
            restore_plan([entry], tmp_path / "dest4", tiers)
    assert _files_under(tmp_path / "dest4") == {}


def test_s3_restore_of_objects_larger_than_a_chunk_reuses_no_stale_bytes(
    tmp_path: Path, services: Services
) -> None:
    """One worker fills the same buffer for every chunk of every object: each file holds its own
    object's bytes, whether its last chunk is short, its size a whole number of chunks, or 0."""
    mib = 1024 * 1024
    shards = {
        "a.bin": os.urandom(9 * mib + 5),
        "b.bin": os.urandom(8 * mib),
        "c.bin": os.urandom(mib + 1),
        "empty.bin": b"",
    }
    objects = s3_objects(services, shards, "")
    files = restore_plan(objects.plan, tmp_path / "dest", objects.tiers, workers=1).files
    assert _files_under(tmp_path / "dest") == shards
    assert [f.size for f in files] == [len(d) for d in shards.values()]


# Shard names that URLs, S3 or shells treat specially; each is one S3 key, read as it is.
URL_LIKE_NAMES = (
    "w.bin",
    "w.bin#x",
    "model.safetensors?rank=0",
    "p%41.bin",
    "p%2541.bin",
    "a+b.bin",
    "sp ace.bin",
    "semi;colon.bin",
)


def test_s3_entries_are_read_by_bucket_and_key_never_by_parsing_the_location(
    tmp_path: Path, services: Services
) -> None:
    """The plan as the API sends it: `w.bin` and `w.bin#x` (and the other names) each restore
    their own object's bytes. Parsing `location` as a URL read `w.bin` for `w.bin#x` and cut
    `model.safetensors?rank=0` to `model.safetensors`."""
    shards = {name: os.urandom(1000 + i) for i, name in enumerate(URL_LIKE_NAMES)}
    objects = s3_objects(services, shards, "pfx/")
    as_sent = [
        PlanEntry.from_json(
            {
                "path": e.path,
                "size": e.size,
                "crc32c": e.crc32c,
                "tier": e.tier,
                "kind": e.kind,
                "node": None,
                "location": e.location,
                "bucket": e.bucket,
                "key": e.key,
            }
        )
        for e in objects.plan
    ]
    restore_plan(as_sent, tmp_path / "dest", objects.tiers, workers=2)
    assert _files_under(tmp_path / "dest") == shards


def test_an_s3_entry_without_bucket_and_key_is_not_guessed_from_its_location(
    tmp_path: Path, services: Services
) -> None:
    objects = s3_objects(services, {"r0.bin": b"bytes"}, "")
    bare = dataclasses.replace(objects.plan[0], bucket=None, key=None)
    with pytest.raises(NoVerifiedCopyError, match="no bucket and key"):
        restore_plan([bare], tmp_path / "dest", objects.tiers)
    assert _files_under(tmp_path / "dest") == {}


def test_progress_counts_a_fallback_read_once(tmp_path: Path) -> None:
    """A shard whose first source does not verify is read again from another: the bytes of the
    failed read are taken back, so progress ends at the total and never passes it."""
    shards = {"a.bin": os.urandom(3_000_000), "b.bin": os.urandom(1_000_000)}
    plan = _posix_plan(tmp_path / "src", shards)
    good = _posix_plan(tmp_path / "good", {"a.bin": shards["a.bin"]})[0]
    Path(plan[0].location).write_bytes(os.urandom(3_000_000))
    other = dataclasses.replace(good, tier="ssd", kind="local")
    seen: list[tuple[int, int]] = []
    files = restore_plan(
        plan,
        tmp_path / "dest",
        {},
        workers=1,
        progress=lambda d, t: seen.append((d, t)),
        fallback=lambda entry, err, tried: other,
    ).files
    assert _files_under(tmp_path / "dest") == shards
    assert [f.tier for f in files] == ["ssd", "lustre"]
    total = sum(map(len, shards.values()))
    assert seen[-1] == (total, total)
    assert max(d for d, _ in seen) <= total
