"""Evidence store blocks: where the frozen crime scene of every attempt is kept.

`EvidenceFolder` keeps evidence in a local (or mounted) folder; `S3EvidenceStore` in an S3 bucket
(or an S3-compatible store), with a local spool for what S3 does not take. Both build their store
with `store()`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from blocks.factories import evidence_folder
from trainguard.core.home import data_path
from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
from trainguard.core.stores.s3.store import S3Store, UploadPolicy
from trainguard.core.stores.s3.spool import MIN_PART_BYTES, Spool
from trainguard.core.stores.base import EvidenceStore, EvidenceStoreError, validate_key


class EvidenceFolder(Block):
    """Keeps each attempt's evidence under `runs/{run_id}/attempt-{n}/` in a folder."""

    _block_type_name = "trainguard Evidence Folder"
    _block_type_slug = "trainguard-evidence-folder"
    _description = "Store attempt evidence (logs, snapshots, checkpoints, core dumps, manifest) in a folder."

    root: str = Field(
        default="trainguard-data/evidence", title="Evidence folder",
        description="Folder that keeps every attempt's evidence; trainguard-data/... lies under TRAINGUARD_HOME when "
        "it is set, another relative path under the flow's working directory; "
        "a mounted volume keeps it beyond the machine.",
    )

    def store(self, no_time_limit: bool = False) -> EvidenceStore:
        """The store this block describes (a folder has no upload time limit to lift)."""
        return evidence_folder(self.root)


class S3EvidenceStore(Block):
    """Keeps each attempt's evidence under `{prefix}/runs/{run_id}/attempt-{n}/` in an S3 bucket.

    Credentials come from the standard AWS chain (environment, shared profile, instance or pod
    role) unless an access key is set here. An attempt spools its evidence under `spool_dir` and
    sends it up after its verdict, so judging and retrying never wait on S3; what S3 does not take
    within `upload_budget_seconds` stays spooled and goes up with the run's next upload or with
    `trainguard evidence flush`.
    """

    _block_type_name = "trainguard S3 Evidence Store"
    _block_type_slug = "trainguard-s3-evidence-store"
    _description = "Store attempt evidence in S3 or an S3-compatible store: checksummed, encrypted, spooled."

    bucket: str = Field(..., description="The bucket.")
    prefix: str = Field(default="trainguard", description="Key prefix for everything trainguard stores.")
    region: str | None = Field(default=None, description="The bucket's region (None: the AWS chain's default).")
    endpoint_url: str | None = Field(default=None, description="For S3-compatible stores (MinIO, Ceph, ...).")
    aws_access_key_id: str | None = Field(default=None, description="Leave empty to use the standard AWS chain.")
    aws_secret_access_key: SecretStr | None = Field(default=None, description="With aws_access_key_id.")
    server_side_encryption: Literal["AES256", "aws:kms"] = Field(
        default="AES256", description="How S3 encrypts every object: AES256 (S3-managed keys) or aws:kms (set kms_key_id).")
    kms_key_id: str | None = Field(default=None, description="KMS key for aws:kms (None: the bucket's default).")
    spool_dir: str = Field(default="trainguard-data/spool", description="Local folder where writes wait for S3 "
                           "(on Kubernetes, put it on a volume that outlives the flow pod: see the README).")
    upload_budget_seconds: float = Field(
        default=300.0, gt=0, description="Longest an attempt's upload, sent after its verdict, waits on S3; what is "
        "not uploaded by then stays spooled for the run's next upload or `trainguard evidence flush`.")
    retry_attempts: int = Field(default=5, ge=1, le=20, description="Tries per S3 request on transient errors.")
    retry_base_delay_seconds: float = Field(default=0.5, ge=0, description="First backoff; doubles per retry.")
    part_size_bytes: int = Field(default=8 * 1024 * 1024, ge=MIN_PART_BYTES, description="Multipart part size.")
    concurrency: int = Field(default=10, ge=1, le=32, description="Parts uploaded at once (as boto3's upload_file).")
    link_expiry_seconds: int = Field(default=7 * 24 * 3600, ge=60, le=7 * 24 * 3600,
                                     description="How long the report's presigned links work (at most 7 days).")

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_key(cls, value: str) -> str:
        stripped = value.strip("/")
        try:
            return validate_key(stripped) if stripped else ""
        except EvidenceStoreError as exc:  # pydantic reports ValueErrors as field errors
            raise ValueError(str(exc).replace("evidence key", "prefix")) from None

    def settings(self) -> S3Settings:
        secret = self.aws_secret_access_key.get_secret_value() if self.aws_secret_access_key else None
        return S3Settings(
            bucket=self.bucket, region=self.region, endpoint_url=self.endpoint_url,
            access_key_id=self.aws_access_key_id, secret_access_key=secret,
            server_side_encryption=self.server_side_encryption, kms_key_id=self.kms_key_id,
            max_connections=self.concurrency + 2,
        )

    def spool_path(self) -> Path:
        """This bucket's spool: one per bucket and endpoint, shared by every prefix in it."""
        endpoint = hashlib.sha256((self.endpoint_url or "aws").encode()).hexdigest()[:8]
        return data_path(self.spool_dir) / f"{self.bucket}-{endpoint}"

    def store(self, no_time_limit: bool = False) -> S3Store:
        """The store this block describes; `flush` asks for one with no upload time limit."""
        policy = UploadPolicy(
            attempts=self.retry_attempts, base_delay_seconds=self.retry_base_delay_seconds,
            budget_seconds=None if no_time_limit else self.upload_budget_seconds,
            part_bytes=self.part_size_bytes, concurrency=self.concurrency,
        )
        spool = Spool(self.spool_path(), preferred_part_bytes=self.part_size_bytes)
        return S3Store(S3Bucket(self.settings()), self.prefix, spool, policy,
                       link_expiry_seconds=self.link_expiry_seconds)
