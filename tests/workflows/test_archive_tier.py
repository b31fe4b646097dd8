"""A second S3 tier in an archive storage class: only every Nth step is promoted to it (the
policy's `promote_every`), its objects carry the tier's storage class and encryption (multipart
uploads too), and a checkpoint restores from it with the client. Tiers whose objects need a
restore request first are refused as a restore source with a clear problem."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.api_fixtures import catalog, nodes
from tests.helpers.cli import api_url
from tests.helpers.lifecycle import running_workers
from tests.helpers.retention import create_job, markers
from tests.helpers.retention import write_checkpoint as run_checkpoint
from tests.helpers.services import Services, s3_client
from tests.helpers.tokens import create_token
from tierpoint.config import Settings
from tierpoint.tier_config import ServerSideEncryption, StorageClass, TierConfig

__all__ = ["api_url", "catalog", "nodes"]

MiB = 1024 * 1024
KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/archive"
EVERY = 2


def archive_of(s3: TierConfig, storage_class: StorageClass) -> TierConfig:
    return TierConfig.model_validate(
        {
            **s3.model_dump(exclude_unset=True),
            "name": "s3-archive",
            "prefix": "archive/",
            "storage_class": storage_class,
            "sse": ServerSideEncryption.KMS,
            "kms_key_id": KMS_KEY,
            # 6 MiB shards: multipart uploads of two parts
            "multipart_part_size": 5 * MiB,
        }
    )


@pytest.fixture
def settings(settings: Settings) -> Settings:
    archive = archive_of(settings.tier("s3"), StorageClass.GLACIER_IR)
    return Settings.model_validate({**settings.model_dump(), "tiers": [*settings.tiers, archive]})


async def test_every_nth_step_goes_to_the_archive_class_and_restores_from_it(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    services: Services,
    api_url: str,
    tmp_path: Path,
) -> None:
    job = f"archive-{uuid.uuid4().hex[:10]}"
    create_job(sessions, job, {"tiers": {"s3-archive": {"promote_every": EVERY}}})
    written = {}
    async with running_workers(settings, client):
        for step in (1, 2, 3):
            seeded, _ = await run_checkpoint(
                settings, sessions, client, job, step, per_node=1, size=6 * MiB + 5
            )
            written[step] = seeded
    state = markers(sessions, job)
    assert state[(2, "s3-archive")] == "restorable"
    # Steps that are not a multiple of EVERY have no copy there at all.
    assert (1, "s3-archive") not in state and (3, "s3-archive") not in state
    assert all(state[(s, "s3")] == "restorable" for s in (1, 2, 3))

    archive = settings.tier("s3-archive")
    raw = s3_client(services)
    listed = raw.list_objects_v2(Bucket=archive.bucket, Prefix=f"archive/{job}/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert keys and all(k.startswith(f"archive/{job}/2/") for k in keys), keys
    for key in keys:
        head = raw.head_object(Bucket=archive.bucket, Key=key)
        assert head["StorageClass"] == "GLACIER_IR"
        assert head["ServerSideEncryption"] == "aws:kms" and head["SSEKMSKeyId"] == KMS_KEY
        assert head["ContentLength"] == 6 * MiB + 5  # a multipart upload (5 MiB parts)

    trainer = create_token(settings.database_url, scopes=[f"train:{job}"])
    restored = TierpointClient(api_url, token=trainer).restore(
        job, tmp_path / "restore", tier="s3-archive"
    )
    assert restored.step == 2
    for shard in written[2].shards:
        assert (tmp_path / "restore" / shard.path).read_bytes() == shard.data


async def test_a_tier_needing_a_restore_request_is_never_a_restore_source(
    settings: Settings,
) -> None:
    glacier = archive_of(settings.tier("s3"), StorageClass.DEEP_ARCHIVE)
    tiers = [t for t in settings.tiers if t.name != "s3-archive"] + [glacier]
    deep = Settings.model_validate({**settings.model_dump(), "tiers": tiers})
    async for http in running_client(create_app(deep)):
        r = await http.get("/v1/jobs/any-job/checkpoints/latest", params={"tier": "s3-archive"})
        assert r.status_code == 409, r.text
        body: dict[str, Any] = r.json()
        assert body["code"] == "tier_needs_restore_request"
        assert "DEEP_ARCHIVE" in body["detail"] and "restore request" in body["detail"]


def test_an_archive_class_tier_can_only_be_the_last() -> None:
    s3 = TierConfig(name="s3", kind="s3", bucket="b")
    deep = archive_of(s3, StorageClass.GLACIER)
    with pytest.raises(ValueError, match="can only be the last tier"):
        Settings(tiers=[deep, s3])
    Settings(tiers=[s3, deep])
