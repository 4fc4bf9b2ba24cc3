"""The checkpoint storage backends the tests run against: a local folder, fsspec's memory
filesystem, and S3 on a real S3-compatible server (moto's) started on loopback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from prudent.checkpoint.storage import CheckpointStorage, open_storage


@pytest.fixture(params=["local", "memory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> CheckpointStorage:
    if request.param == "local":
        return open_storage(str(tmp_path / "ckpts"))
    if request.param == "memory":
        return open_storage(f"memory://prudent-tests/{uuid.uuid4().hex}")
    endpoint = request.getfixturevalue("s3_endpoint")
    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "PRUDENT_S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(var, value)
    import s3fs

    bucket = f"bucket-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}).mkdir(bucket)
    return open_storage(f"s3://{bucket}/runs/r1/checkpoints")
