"""The S3 evidence block: its fields checked on the way in, its secret kept out of sight."""

from __future__ import annotations

import pydantic
import pytest

from blocks.evidence import S3EvidenceStore
from trainguard.core.stores.s3.store import S3Store


def test_the_prefix_is_normalised_and_a_bad_one_is_refused_naming_the_field() -> None:
    assert S3EvidenceStore(bucket="b", prefix="/team/evidence/").prefix == "team/evidence"
    with pytest.raises(pydantic.ValidationError, match=r"prefix[\s\S]*segment '\.\.' is not allowed"):
        S3EvidenceStore(bucket="b", prefix="team/../x")


def test_an_access_key_in_the_block_is_used_but_never_shown(s3, tmp_path) -> None:
    block = S3EvidenceStore(bucket=s3.new_bucket(), endpoint_url=s3.proxy.url, region="us-east-1",
                            aws_access_key_id="AKIABLOCK", aws_secret_access_key="block-secret-93",
                            spool_dir=str(tmp_path / "spool"))
    store = block.store()

    store.put_bytes("runs/r1/attempt-1/a", b"a")

    assert isinstance(store, S3Store) and store.pending() == []
    assert "block-secret-93" not in repr(block) and "block-secret-93" not in repr(block.settings())
    assert store.spool.root.parent == tmp_path / "spool"  # one spool per bucket and endpoint
