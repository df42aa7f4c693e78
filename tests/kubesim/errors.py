"""API errors as the apiserver words them, each able to render its `Status` body.

The store and the REST layer raise these; the server turns them into responses. Messages are
the apiserver's own (k8s.io/apimachinery/pkg/api/errors/errors.go).
"""

from __future__ import annotations

from typing import Any

from kubesim.resources import RESOURCES


class ApiError(Exception):
    """An error the API answers with a `Status` body."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        """The `Status` object for this error."""
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: str, name: str) -> dict[str, Any]:
    res = RESOURCES.get(resource)
    details: dict[str, Any] = {"name": name, "kind": resource}
    if res is not None and res.group:
        details["group"] = res.group
    return details


def _qualified(resource: str) -> str:
    res = RESOURCES.get(resource)
    return res.qualified if res is not None else resource


class NotFound(ApiError):
    code = 404
    reason = "NotFound"

    @classmethod
    def of(cls, resource: str, name: str) -> NotFound:
        return cls(f'{_qualified(resource)} "{name}" not found', details=_details(resource, name))


class AlreadyExists(ApiError):
    code = 409
    reason = "AlreadyExists"

    @classmethod
    def of(cls, resource: str, name: str) -> AlreadyExists:
        return cls(f'{_qualified(resource)} "{name}" already exists',
                   details=_details(resource, name))


class Conflict(ApiError):
    code = 409
    reason = "Conflict"

    @classmethod
    def of(cls, resource: str, name: str) -> Conflict:
        return cls(f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": the object '
                   "has been modified; please apply your changes to the latest version and try "
                   "again", details=_details(resource, name))


class Invalid(ApiError):
    code = 422
    reason = "Invalid"

    @classmethod
    def of(cls, resource: str, name: str, causes: list[tuple[str, str, str]]) -> Invalid:
        """causes: (reason e.g. FieldValueRequired, field path, message)."""
        kind = RESOURCES[resource].kind if resource in RESOURCES else resource
        text = "; ".join(f"{field}: {msg}" for _, field, msg in causes)
        details = _details(resource, name)
        details["kind"] = kind
        details["causes"] = [{"reason": r, "message": m, "field": f} for r, f, m in causes]
        return cls(f'{kind} "{name}" is invalid: {text}', details=details)


class BadRequest(ApiError):
    code = 400
    reason = "BadRequest"


class Forbidden(ApiError):
    code = 403
    reason = "Forbidden"


class Expired(ApiError):
    code = 410
    reason = "Expired"


class MethodNotAllowed(ApiError):
    code = 405
    reason = "MethodNotAllowed"


class UnsupportedMediaType(ApiError):
    code = 415
    reason = "UnsupportedMediaType"


STATUS_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
    410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}


def status_for(code: int, message: str) -> dict[str, Any]:
    """A `Status` body for an arbitrary code (fault rules use this)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": STATUS_REASONS.get(code, "Unknown"), "code": code}
