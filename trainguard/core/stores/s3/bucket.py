"""The S3 adapter: the one module that imports boto3, and the error tree its calls raise.

Each method is one S3 call on one bucket. Library exceptions are translated once, here: a missing
object is `EvidenceNotFound`; 5xx, SlowDown/throttling, timeouts and dropped connections are
`S3Transient` (worth retrying); access denied, a missing bucket, bad credentials and other 4xx are
`S3Permanent` (retrying cannot help). Retrying, spooling and the evidence-store protocol are
``store``'s business. Messages are one line and never carry credentials.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlencode

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from trainguard.core.stores.base import EvidenceNotFound, EvidenceStoreError

_TRANSIENT_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException",
    "RequestLimitExceeded", "TooManyRequestsException", "RequestTimeTooSkewed",
})
_DENIED_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AllAccessDisabled",
})
_READ_CHUNK_BYTES = 1024 * 1024


class S3Error(EvidenceStoreError):
    """An S3 call failed; the message names the bucket, the key and what to do."""


class S3Transient(S3Error):
    """Worth retrying: a 5xx, SlowDown or throttling, a timeout, a dropped connection."""


class S3Permanent(S3Error):
    """Retrying cannot help: access denied, no such bucket, bad credentials, a refused request."""


class NoSuchUpload(S3Permanent):
    """The multipart upload to resume no longer exists (completed, aborted or expired)."""


@dataclass(frozen=True)
class S3Settings:
    """Where the bucket is and how to talk to it. Credentials come from the standard AWS chain."""

    bucket: str
    region: str | None = None
    endpoint_url: str | None = None
    access_key_id: str | None = None  # None: the standard AWS chain (env, profile, instance role)
    secret_access_key: str | None = field(default=None, repr=False)
    server_side_encryption: str = "AES256"  # or "aws:kms"
    kms_key_id: str | None = None
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 60.0
    max_connections: int = 10


@dataclass(frozen=True)
class HeadResult:
    """An object's size and its stored SHA-256 checksum ("" when it was stored without one)."""

    size_bytes: int
    checksum_sha256: str


def translate(exc: Exception, bucket: str, what: str) -> Exception:
    """The project's error for a boto3/botocore exception raised while doing ``what``."""
    where = f"s3://{bucket}: {what}"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        detail = _one_line(str(error.get("Message") or code or status))
        if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
            if code == "NoSuchUpload":
                return NoSuchUpload(f"{where}: the multipart upload is gone ({detail})")
            return EvidenceNotFound(f"{where}: no such object")
        if code == "NoSuchBucket":
            return S3Permanent(f"{where}: bucket {bucket!r} does not exist; create it or fix the block's bucket")
        if code in _DENIED_CODES or status == 403:
            return S3Permanent(
                f"{where}: access denied ({code or status}: {detail}); check the AWS credentials and the "
                "bucket policy (s3:PutObject, s3:GetObject, s3:ListBucket on the prefix)"
            )
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return S3Transient(f"{where}: {code or status}: {detail}")
        return S3Permanent(f"{where}: refused ({code or status}: {detail})")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return S3Permanent(f"{where}: no usable AWS credentials; set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                           "AWS_SECRET_ACCESS_KEY, or run where an instance role is available")
    if isinstance(exc, BotoConnectionError | ConnectionClosedError | ReadTimeoutError | ResponseStreamingError
                  | IncompleteReadError):
        return S3Transient(f"{where}: {type(exc).__name__}: {_one_line(str(exc))}")
    if isinstance(exc, BotoCoreError):
        return S3Permanent(f"{where}: {type(exc).__name__}: {_one_line(str(exc))}")
    if isinstance(exc, OSError):  # a connection reset surfacing below botocore
        return S3Transient(f"{where}: {type(exc).__name__}: {_one_line(str(exc))}")
    return exc


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


class S3Bucket:
    """One bucket through one boto3 client: each method is one S3 call, errors translated."""

    def __init__(self, settings: S3Settings, client: Any = None) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self._client = client if client is not None else _make_client(settings)

    def _call(self, what: str, operation: str, **params: Any) -> Any:
        try:
            return getattr(self._client, operation)(Bucket=self.bucket, **params)
        except Exception as exc:
            translated = translate(exc, self.bucket, what)
            if translated is exc:
                raise
            raise translated from exc

    def _encryption(self) -> dict[str, str]:
        params = {"ServerSideEncryption": self.settings.server_side_encryption}
        if self.settings.kms_key_id:
            params["SSEKMSKeyId"] = self.settings.kms_key_id
        return params

    def put_object(self, key: str, body: bytes, checksum_sha256: str, tags: Mapping[str, str]) -> str:
        """Store ``body`` (S3 checks it against ``checksum_sha256``); return the stored checksum."""
        extra = {"Tagging": urlencode(dict(tags))} if tags else {}
        response = self._call(f"put {key}", "put_object", Key=key, Body=body, ChecksumAlgorithm="SHA256",
                              ChecksumSHA256=checksum_sha256, **self._encryption(), **extra)
        return str(response.get("ChecksumSHA256") or "")

    def create_multipart_upload(self, key: str, tags: Mapping[str, str]) -> str:
        """Start a multipart upload with SHA-256 part checksums; return its upload id."""
        extra = {"Tagging": urlencode(dict(tags))} if tags else {}
        response = self._call(f"start the upload of {key}", "create_multipart_upload", Key=key,
                              ChecksumAlgorithm="SHA256", **self._encryption(), **extra)
        return str(response["UploadId"])

    def upload_part(self, key: str, upload_id: str, number: int, body: IO[bytes] | io.RawIOBase,
                    checksum_sha256: str) -> str:
        """Send one part (S3 checks it against ``checksum_sha256``); return its ETag."""
        response = self._call(f"upload part {number} of {key}", "upload_part", Key=key, UploadId=upload_id,
                              PartNumber=number, Body=body, ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum_sha256)
        return str(response["ETag"])

    def list_parts(self, key: str, upload_id: str) -> dict[int, tuple[str, str]]:
        """The parts already uploaded: number → (ETag, ChecksumSHA256)."""
        parts: dict[int, tuple[str, str]] = {}
        marker = 0
        while True:
            response = self._call(f"list the uploaded parts of {key}", "list_parts", Key=key, UploadId=upload_id,
                                  PartNumberMarker=marker)
            for part in response.get("Parts", []):
                parts[int(part["PartNumber"])] = (str(part["ETag"]), str(part.get("ChecksumSHA256") or ""))
            if not response.get("IsTruncated"):
                return parts
            marker = int(response["NextPartNumberMarker"])

    def complete_multipart_upload(self, key: str, upload_id: str, parts: list[tuple[int, str, str]]) -> str:
        """Join the parts (number, ETag, ChecksumSHA256); return the object's composite checksum."""
        listing = [{"PartNumber": n, "ETag": etag, "ChecksumSHA256": checksum} for n, etag, checksum in parts]
        response = self._call(f"complete the upload of {key}", "complete_multipart_upload", Key=key,
                              UploadId=upload_id, MultipartUpload={"Parts": listing})
        return str(response.get("ChecksumSHA256") or "")

    def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts."""
        self._call(f"abort the upload of {key}", "abort_multipart_upload", Key=key, UploadId=upload_id)

    def head(self, key: str) -> HeadResult:
        """Size and stored SHA-256 checksum of ``key``, without downloading it."""
        response = self._call(f"head {key}", "head_object", Key=key, ChecksumMode="ENABLED")
        return HeadResult(int(response["ContentLength"]), str(response.get("ChecksumSHA256") or ""))

    def read_chunks(self, key: str) -> Iterator[bytes]:
        """Stream ``key``'s bytes in 1 MiB chunks; errors mid-stream are translated too."""
        body = self._call(f"get {key}", "get_object", Key=key)["Body"]
        try:
            while True:
                try:
                    chunk = body.read(_READ_CHUNK_BYTES)
                except Exception as exc:
                    raise translate(exc, self.bucket, f"read {key}") from exc
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    def get_bytes(self, key: str) -> bytes:
        """The whole of ``key`` (for small objects such as manifests)."""
        return b"".join(self.read_chunks(key))

    def list_keys(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted."""
        keys: list[str] = []
        token: dict[str, str] = {}
        while True:
            response = self._call(f"list {prefix or '/'}", "list_objects_v2", Prefix=prefix, **token)
            keys.extend(str(item["Key"]) for item in response.get("Contents", []))
            if not response.get("IsTruncated"):
                return sorted(keys)
            token = {"ContinuationToken": str(response["NextContinuationToken"])}

    def delete(self, key: str) -> None:
        """Delete ``key`` (deleting an absent key succeeds, as in S3)."""
        self._call(f"delete {key}", "delete_object", Key=key)

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """Replace ``key``'s tags."""
        tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
        self._call(f"tag {key}", "put_object_tagging", Key=key, Tagging={"TagSet": tag_set})

    def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        """Replace the bucket's lifecycle configuration with ``rules``."""
        self._call("set the lifecycle rules", "put_bucket_lifecycle_configuration",
                   LifecycleConfiguration={"Rules": rules})

    def get_lifecycle(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules ([] when it has none)."""
        try:
            response = self._call("read the lifecycle rules", "get_bucket_lifecycle_configuration")
        except (S3Error, EvidenceNotFound) as exc:  # a 404 for a bucket that never had rules
            cause = exc.__cause__
            if isinstance(cause, ClientError) and cause.response["Error"].get("Code") == "NoSuchLifecycleConfiguration":
                return []
            raise
        return list(response.get("Rules", []))

    def presign(self, key: str, expires_seconds: int) -> str:
        """A GET URL for ``key`` that works without credentials until it expires (no network call)."""
        try:
            return str(self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=int(expires_seconds)))
        except Exception as exc:
            raise translate(exc, self.bucket, f"presign {key}") from exc


def _make_client(settings: S3Settings) -> Any:
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
        retries={"total_max_attempts": 1},  # ``store`` retries, within the attempt's time budget
        max_pool_connections=settings.max_connections,
        signature_version="s3v4",
        # Every write carries its SHA-256 for S3 to check, so the body is not hashed a second time for the
        # signature (botocore already skips that over HTTPS when a checksum is sent; this covers http endpoints)
        s3={"payload_signing_enabled": False, **({"addressing_style": "path"} if settings.endpoint_url else {})},
        request_checksum_calculation="when_required",  # we send our own SHA-256 with every write
        response_checksum_validation="when_required",
    )
    keys = {}
    if settings.access_key_id and settings.secret_access_key:
        keys = {"aws_access_key_id": settings.access_key_id, "aws_secret_access_key": settings.secret_access_key}
    global _SESSION
    with _SESSION_LOCK:  # one session: loading botocore's service model takes about a second
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", region_name=settings.region, endpoint_url=settings.endpoint_url or None,
                               config=config, **keys)


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()
