"""The run spec: what a user asks trainguard to run, validated before anything is written.

A spec arrives as YAML (``trainguard run SPEC.yaml``), as a flow parameter from the Prefect UI, or
as a dict from a notebook; all three go through `TrainingSpec`. Errors are turned into one line that
names the field and says how to fix it (`SpecError`), never a pydantic dump.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainguard.core import policy
from trainguard.core.taxonomy import Category

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


class SpecError(ValueError):
    """A spec that cannot be run; the message is one line naming the field and the fix."""


class CategoryOverrideSpec(BaseModel):
    """Per-category retry settings; unset fields keep the policy's value."""

    model_config = ConfigDict(extra="forbid")

    retryable: bool | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    delay_seconds: float | None = Field(default=None, ge=0)


class RetrySpec(BaseModel):
    """Retry settings of a run; defaults are the taxonomy's rules of thumb."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(default=3, ge=1, le=100)
    backoff: policy.Backoff = policy.Backoff.FIXED
    delay_seconds: float = Field(default=10.0, ge=0)
    max_delay_seconds: float = Field(default=300.0, ge=0)
    same_signature_limit: int = Field(default=2, ge=0)
    require_checkpoint_progress: bool = True
    overrides: dict[Category, CategoryOverrideSpec] = Field(default_factory=dict)

    def to_policy(self) -> policy.RetryPolicy:
        """The core policy these settings describe."""
        return policy.RetryPolicy(
            max_attempts=self.max_attempts,
            backoff=self.backoff,
            delay_seconds=self.delay_seconds,
            max_delay_seconds=self.max_delay_seconds,
            same_signature_limit=self.same_signature_limit,
            require_checkpoint_progress=self.require_checkpoint_progress,
            overrides={
                category: policy.CategoryOverride(o.retryable, o.max_attempts, o.delay_seconds)
                for category, o in self.overrides.items()
            },
        )


class TrainingSpec(BaseModel):
    """One training run: the command, its environment, its limits and how it is retried."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Run name: lowercase letters, digits and dashes, at most 42 characters.")
    command: list[str] = Field(min_length=1, description="The training command, as a list or a shell-quoted string.")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    gpus: int = Field(default=0, ge=0)
    deadline_seconds: float | None = Field(default=None, gt=0)
    stall_seconds: float | None = Field(default=None, gt=0)
    retry: RetrySpec | None = None

    @field_validator("name")
    @classmethod
    def _name_is_a_label(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("use lowercase letters, digits and dashes (at most 42), e.g. 'resnet-sweep-3'")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        if isinstance(value, str):
            return shlex.split(value)
        return value

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: list[str]) -> list[str]:
        if not value or not value[0].strip():
            raise ValueError("give the program to run first, e.g. ['python', 'train.py']")
        return value


def parse_spec(data: Any, source: str = "spec") -> TrainingSpec:
    """Validate `data` as a spec, raising `SpecError` with a one-line message."""
    if isinstance(data, TrainingSpec):
        return data
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with at least 'name' and 'command', got {type(data).__name__}")
    try:
        return TrainingSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, source)) from None


def load_spec(path: str | Path) -> TrainingSpec:
    """Read and validate a YAML spec file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file; pass the path of a YAML run spec") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{path}:{where}: {problem}; fix the YAML syntax") from None
    return parse_spec(data, str(path))


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """The first problem of a pydantic error as `source: field.path: message`, plus a count of the rest."""
    errors = exc.errors()
    first = errors[0]
    location = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"]
    if first["type"] == "missing":
        message = "this field is required"
    elif first["type"] == "extra_forbidden":
        message = "unknown field; check its spelling against the documented spec fields"
    elif first["type"] == "enum" and "overrides" in location:
        valid = ", ".join(c.value for c in Category)
        message = f"unknown failure category {first.get('input')!r}; use one of: {valid}"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{source}: {location}: {message}{more}"
