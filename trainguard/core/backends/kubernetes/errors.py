"""The Kubernetes adapter's own error tree, free of the client library.

`trainguard.core.backends.kubernetes.api` translates every client exception into one of these once, at the edge,
chained with `from exc`; nothing else in trainguard sees `kubernetes.client.ApiException` or a
urllib3 error. Only `Transient` is ever retried: a 403 or a 422 retried would hide a real
configuration problem.
"""

from __future__ import annotations


class KubeError(Exception):
    """A Kubernetes API call failed. `status` is the HTTP status (0 when no answer came)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    """404: the object is not there (never was, or was deleted)."""


class Conflict(KubeError):
    """409: it already exists (on create) or changed under us (on update)."""


class Forbidden(KubeError):
    """401/403: the credentials may not do this; fix RBAC or the kubeconfig, retrying won't help."""


class Expired(KubeError):
    """410: a resourceVersion or continue token is too old; list again, then resume."""


class Invalid(KubeError):
    """400/422: the API refused the request body; the message says which field."""


class Transient(KubeError):
    """429, 5xx, a timeout or a dropped connection: worth retrying after a pause."""


def from_status(status: int, message: str, reason: str = "") -> KubeError:
    """The error class for an HTTP status."""
    if status == 404:
        return NotFound(message, status, reason)
    if status == 409:
        return Conflict(message, status, reason)
    if status in (401, 403):
        return Forbidden(message, status, reason)
    if status == 410:
        return Expired(message, status, reason)
    if status == 429 or status >= 500 or status == 0:
        return Transient(message, status, reason)
    if status in (400, 422):
        return Invalid(message, status, reason)
    return KubeError(message, status, reason)
