"""S3 store tests: boto3 against moto in server mode on loopback, through the fault proxy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from s3fixtures import FAST, S3Server, s3, s3_server  # noqa: F401  (fixtures)

from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
from trainguard.core.stores.s3.store import S3Store, UploadPolicy
from trainguard.core.stores.s3.spool import Spool



@pytest.fixture
def make_store(s3: S3Server, tmp_path: Path) -> Callable[..., S3Store]:
    """A store on a fresh bucket (or ``bucket=``), through the proxy, spooling under this test's folder."""
    made: dict[str, str] = {}

    def make(bucket: str | None = None, prefix: str = "tg", policy: UploadPolicy = FAST, clock: Any = None,
             **kw: Any) -> S3Store:
        if bucket is None and "bucket" not in made:
            made["bucket"] = s3.new_bucket()
        name = bucket or made["bucket"]
        kw = {"connect_timeout_seconds": 2, "read_timeout_seconds": 10, **kw}
        settings = S3Settings(bucket=name, region="us-east-1", endpoint_url=s3.proxy.url, **kw)
        timing = {"clock": clock} if clock else {}
        return S3Store(S3Bucket(settings), prefix, Spool(tmp_path / "spool", policy.part_bytes), policy, **timing)

    return make
