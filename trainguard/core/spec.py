"""The run spec: what a user asks trainguard to run, validated before anything is written.

A spec arrives as YAML (``trainguard run SPEC.yaml``), as a flow parameter from the Prefect UI, or
as a dict from a notebook; all three go through `TrainingSpec`. Errors are turned into one line that
names the field and says how to fix it (`SpecError`), never a pydantic dump.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainguard.core import masking, policy
from trainguard.core.taxonomy import Category
from trainguard_entrypoint.redact import MIN_MASKED_LENGTH, redact_argv

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_BLOCK = re.compile(r"^[a-z0-9][a-z0-9-]*$")

MAX_NODES = 1000
MAX_SPEC_BYTES = 256 * 1024
"""A spec travels as a flow-run parameter of every attempt, beside the attempts' history; Prefect's
server refuses parameters over 512 KiB in all (``PREFECT_SERVER_API_MAX_PARAMETER_SIZE``), so the
spec may use half of that."""


class SpecError(ValueError):
    """A spec that cannot be run; the message is one line naming the field and the fix."""


class CategoryOverrideSpec(BaseModel):
    """Per-category retry settings; unset fields keep the policy's value."""

    model_config = ConfigDict(extra="forbid")

    retryable: bool | None = Field(
        default=None, title="Retryable",
        description="Whether this category is retried at all; empty = the taxonomy's answer.")
    max_attempts: int | None = Field(
        default=None, ge=1, strict=True, title="Max attempts",
        description="Attempts in a row without checkpoint progress when the latest failure is of this category "
        "(counted as retry.max_attempts is); empty = the policy's.")
    delay_seconds: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, title="Delay (s)",
        description="Wait before the next attempt after this category; empty = the policy's backoff.")


class RetrySpec(BaseModel):
    """Retry settings of a run; defaults are the taxonomy's rules of thumb."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(
        default=3, ge=1, le=100, strict=True, title="Max attempts",
        description="Attempts in a row without checkpoint progress (none saved a checkpoint newer than the one it "
        "resumed from), the first attempt included; an attempt that moves the checkpoint forward refills it.")
    max_total_attempts: int | None = Field(
        default=None, ge=1, le=1000, strict=True, title="Max attempts in all",
        description="Optional bound on a run's attempts in all, progress or not (as a Job's backoffLimit); "
        "empty = no bound.")
    backoff: policy.Backoff = Field(
        default=policy.Backoff.FIXED, title="Backoff strategy",
        description="fixed: the same delay every time; exponential: the delay doubles, up to the max delay.")
    delay_seconds: float = Field(
        default=10.0, ge=0, allow_inf_nan=False, title="Delay (s)",
        description="Wait before the next attempt (the first wait, for exponential backoff).")
    max_delay_seconds: float = Field(
        default=300.0, ge=0, allow_inf_nan=False, title="Max delay (s)",
        description="The longest wait exponential backoff reaches.")
    same_signature_limit: int = Field(
        default=2, ge=0, strict=True, title="Same-failure limit",
        description="Circuit breaker: the run stops after this many attempts in a row fail the same way (0 = off).")
    require_checkpoint_progress: bool = Field(
        default=True, title="Require checkpoint progress",
        description="Stop the run when two attempts in a row resumed from the same checkpoint and saved no newer one.")
    overrides: dict[Category, CategoryOverrideSpec] = Field(
        default_factory=dict, title="Per-category overrides",
        description="By failure category (e.g. nccl_error, cuda_oom): retryable, max attempts, delay.")
    host_oom_memory_factor: float = Field(
        default=1.0, ge=1.0, le=policy.MAX_MEMORY_FACTOR, title="Memory factor after a host OOM",
        description="Opt-in: after a host_oom that overrides make retryable, the next attempt's memory request "
        f"and limit are multiplied by this (compounding, at most {policy.MAX_MEMORY_FACTOR:g}x in all); 1 = off.",
    )

    @model_validator(mode="after")
    def _memory_factor_needs_a_retry(self) -> RetrySpec:
        oom = self.overrides.get(Category.HOST_OOM)
        if self.host_oom_memory_factor > 1.0 and not (oom and oom.retryable):
            raise ValueError("host_oom_memory_factor: host_oom is not retried, so the factor would never apply; "
                             "add overrides: {host_oom: {retryable: true}} or drop the factor")
        return self

    def to_policy(self) -> policy.RetryPolicy:
        """The core policy these settings describe."""
        return policy.RetryPolicy(
            max_attempts=self.max_attempts,
            max_total_attempts=self.max_total_attempts,
            backoff=self.backoff,
            delay_seconds=self.delay_seconds,
            max_delay_seconds=self.max_delay_seconds,
            same_signature_limit=self.same_signature_limit,
            require_checkpoint_progress=self.require_checkpoint_progress,
            overrides={
                category: policy.CategoryOverride(o.retryable, o.max_attempts, o.delay_seconds)
                for category, o in self.overrides.items()
            },
            host_oom_memory_factor=self.host_oom_memory_factor,
        )


# A notice's grace: at least a second to act on it, at most an hour (Kubernetes takes any int64; no
# platform warns that far ahead, and a longer one only keeps a node that was asked back).
MIN_NOTICE_GRACE_SECONDS, MAX_NOTICE_GRACE_SECONDS = 1, 3600


class TrainingSpec(BaseModel):
    """One training run: the command, its environment, its limits and how it is retried."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Run name: lowercase letters, digits and dashes, at most 42 characters.")
    command: list[str] = Field(min_length=1, description="The training command, as a list or a shell-quoted string.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Plain environment variables of the training command; a secret-looking value is refused "
        "(pass it through secret_env: specs are stored in clear as flow-run parameters).")
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables whose values are secrets, resolved when the attempt starts: the name of a "
        "Prefect Secret block, or 'env:NAME' for a variable of the worker's environment.",
    )
    workdir: str | None = Field(
        default=None,
        description="The command's working directory. Local: relative to where trainguard runs (./dev runs "
        "from the checkout), default that directory; Kubernetes: the container's workingDir, default the "
        "image's WORKDIR; Slurm: sbatch --chdir, default the attempt's folder on the shared filesystem.")
    gpus: int = Field(default=0, ge=0, strict=True, description="GPUs per node.")
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, strict=True,
                       description="Nodes of one attempt: N pods of an Indexed Job, or a Slurm job on N nodes.")
    processes_per_node: int | None = Field(
        default=None, ge=1, le=1024, strict=True,
        description="Processes per node (torchrun's nproc_per_node); empty = gpus, or 1 without GPUs.")
    deadline_seconds: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Wall-time limit of one attempt (Kubernetes: activeDeadlineSeconds; Slurm: --time); "
        "an attempt over it ends as timeout.")
    stall_seconds: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Nothing new (console, rank logs, checkpoints) for this long ends a hung attempt, once "
        "every rank's stack is taken (at 80 % of it).")
    notice_grace_seconds: float | None = Field(
        default=None, allow_inf_nan=False,
        description="Time the training has from a notice (a pod evicted or deleted, Slurm's warning before "
        "its time limit, the attempt's deadline, a cancel) to the hard stop, to save a checkpoint: "
        "Kubernetes: the pod's terminationGracePeriodSeconds (default 30); Slurm: how long before the time "
        "limit --signal warns (default the backend's signal_lead_seconds); local: the SIGTERM-to-SIGKILL "
        "time. Also how early the attempt's own deadline gives notice.")
    retry: RetrySpec | None = Field(
        default=None,
        description="How failures are retried; else the named retry policy block, else the defaults.")
    backend: str | None = Field(default=None, description="A saved backend block as slug/name, e.g. "
                                "trainguard-kubernetes-job-backend/gpu-cluster; the CLI's --backend wins.")

    @model_validator(mode="after")
    def _trainguard_alone_retries(self) -> TrainingSpec:
        if (problem := in_job_restarts(self.command, self.env)) is not None:
            raise ValueError(problem)
        if self.processes_per_node is None:  # torchrun's own --nproc-per-node says it, where given
            self.processes_per_node = launcher_nprocs(self.command)
        if (problem := launcher_disagrees(self.command, self.nodes, self.nprocs)) is not None:
            raise ValueError(problem)
        return self

    @property
    def total_gpus(self) -> int:
        """GPUs one attempt holds on all its nodes: what GPU-seconds count."""
        return self.gpus * self.nodes

    @property
    def nprocs(self) -> int:
        """Processes per node: the spec's (or torchrun's --nproc-per-node), else one per GPU, else one."""
        return self.processes_per_node or self.gpus or 1

    @field_validator("notice_grace_seconds")
    @classmethod
    def _notice_grace_in_range(cls, value: float | None) -> float | None:
        if value is not None and not MIN_NOTICE_GRACE_SECONDS <= value <= MAX_NOTICE_GRACE_SECONDS:
            raise ValueError(f"{value:g} is out of range: give the seconds a checkpoint on notice needs, from "
                             f"{MIN_NOTICE_GRACE_SECONDS} to {MAX_NOTICE_GRACE_SECONDS}, e.g. 60")
        return value

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
        for index, argument in enumerate(value):
            if not argument:
                raise ValueError(f"argument {index} is empty; remove it, or quote the value it was meant to hold")
            if "\0" in argument:
                raise ValueError(f"argument {index} contains a NUL byte, which no command line can hold")
        if (secret := _secret_argument(value)) is not None:
            raise ValueError(
                f"argument {secret} looks like a secret, and the command is stored in clear as a flow-run parameter; "
                "pass it as secret_env: {NAME: <Prefect Secret block name>} or {NAME: 'env:VARIABLE'} and have "
                "the command read the variable NAME"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_is_an_environment(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            _check_variable_name(name)
            if "\0" in text:
                raise ValueError(f"{name}: the value contains a NUL byte, which no environment can hold")
            if masking.Masker.from_environ({name: text}).mask(text) != text:
                raise ValueError(
                    f"{name}: looks like a secret, and env values are stored in clear as flow-run parameters; "
                    f"pass it as secret_env: {{{name}: <Prefect Secret block name>}} or {{{name}: 'env:VARIABLE'}} "
                    "naming a variable of the worker's environment"
                )
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_env_references(cls, value: dict[str, str]) -> dict[str, str]:
        for name, reference in value.items():
            _check_variable_name(name)
            variable = reference.removeprefix("env:")
            if reference.startswith("env:") and not _VARIABLE.match(variable):
                raise ValueError(f"entry {name}: {masking.for_people(repr(reference))} does not name a variable; write 'env:NAME', e.g. 'env:HF_TOKEN'")
            if not reference.startswith("env:") and not _SECRET_BLOCK.match(reference):
                raise ValueError(
                    # "entry": what trainguard shows is masked, and `secret_env: NAME` reads as an assignment
                    # a value pasted where a reference goes may be the secret itself: its shape is masked
                    f"entry {name}: {masking.for_people(repr(reference))} is neither a Prefect Secret block name (lowercase letters, digits, "
                    "dashes) nor 'env:NAME' for a variable of the worker's environment"
                )
        return value


def _secret_argument(argv: list[str]) -> int | None:
    """The index of the first argument that would be masked in what trainguard shows, if any.

    The same line as for env values: a value ``redact_argv`` hides after a secret-named flag counts
    from `MIN_MASKED_LENGTH` characters on (``--sort-key loss`` is no secret), and anything the
    masker changes by shape (tokens, URL passwords, ``PASSWORD=…``) counts whatever its length.
    """
    masker = masking.Masker()
    for index, (argument, shown) in enumerate(zip(argv, redact_argv(argv), strict=True)):
        if masker.mask(argument) != argument:
            return index
        if shown == argument:
            continue
        hidden = argument if shown == masking.REDACTED else argument.partition("=")[2]
        if shown not in (masking.REDACTED, f"{argument.partition('=')[0]}={masking.REDACTED}"):
            return index  # a URL password
        if len(hidden) >= MIN_MASKED_LENGTH:
            return index
    return None


_TORCHRUN = re.compile(r"(?:^|/)torchrun$|^torch\.distributed\.(?:run|launch)$")


def _launcher_options(command: list[str]) -> dict[str, str]:
    """torchrun's own options in a command (``torchrun ...`` or ``python -m torch.distributed.run ...``),
    by their underscore names; {} when the command does not start torchrun."""
    start = next((i + 1 for i, word in enumerate(command[:4]) if _TORCHRUN.search(word)), None)
    if start is None:
        return {}
    options: dict[str, str] = {}
    words = command[start:]
    for i, word in enumerate(words):
        if not word.startswith("--"):
            if i == 0 or not words[i - 1].startswith("--") or "=" in words[i - 1]:
                break  # the training script: what follows is its own arguments
            continue
        name, eq, value = word[2:].partition("=")
        options[name.replace("-", "_")] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
    return options


def in_job_restarts(command: list[str], env: dict[str, str]) -> str | None:
    """Why the spec asks the launcher to restart ranks itself, in one line; None when it does not."""
    value = _launcher_options(command).get("max_restarts", env.get("PET_MAX_RESTARTS"))
    where = "command: --max-restarts" if "max_restarts" in _launcher_options(command) else "env: PET_MAX_RESTARTS"
    if value is None or value.strip() in ("", "0"):
        return None
    return (f"{where} {value}: trainguard alone retries an attempt, from its last checkpoint and off a failed "
            "node; restarts inside the job would hide failures from it and repeat them on the same node, as a "
            "Job's backoffLimit would; drop it (or set it to 0) and set retry.max_attempts instead")


def launcher_nprocs(command: list[str]) -> int | None:
    """torchrun's --nproc-per-node in the command, when it is a number."""
    given = _launcher_options(command).get("nproc_per_node", "")
    return int(given) if given.isdigit() and int(given) > 0 else None


def launcher_disagrees(command: list[str], nodes: int, nprocs: int) -> str | None:
    """Why torchrun's own --nnodes/--nproc-per-node contradict the spec's, in one line; None when they agree."""
    options = _launcher_options(command)
    for name, field, wanted in (("nnodes", "nodes", nodes), ("nproc_per_node", "processes_per_node", nprocs)):
        given = options.get(name)
        if given is not None and given.isdigit() and int(given) != wanted:
            flag = "--" + name.replace("_", "-")
            return (f"command: {flag} {given} disagrees with {field}: {wanted}; leave {flag} out (trainguard passes "
                    f"it to torchrun as PET_{name.upper()}) or set {field}: {given}")
    return None


def _check_variable_name(name: str) -> None:
    if not name or "=" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a variable name: names cannot be empty or hold '=' or NUL; use e.g. WANDB_PROJECT")


_TOO_DEEP = ("nested too deeply to read (deeper than the parser's limit); a run spec is a mapping of plain "
             "values and lists a few levels deep")


def parse_spec(data: Any, source: str = "spec") -> TrainingSpec:
    """Validate `data` as a spec, raising `SpecError` with a one-line message."""
    if isinstance(data, TrainingSpec):
        return data
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with at least 'name' and 'command', got {type(data).__name__}")
    try:
        spec = TrainingSpec.model_validate(data)
        size = len(json.dumps(spec.model_dump(mode="json"), separators=(",", ":")).encode())
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, source)) from None
    except RecursionError:
        raise SpecError(f"{source}: {_TOO_DEEP}") from None
    if size > MAX_SPEC_BYTES:
        biggest = max(spec.model_dump(mode="json").items(), key=lambda item: len(json.dumps(item[1])))[0]
        raise SpecError(
            f"{source}: {biggest}: the spec is {size:,} bytes as JSON, over the {MAX_SPEC_BYTES:,}-byte limit of a "
            "flow-run parameter; put large values in a file the command reads"
        )
    return spec


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
    except RecursionError:
        raise SpecError(f"{path}: {_TOO_DEEP}") from None
    return parse_spec(data, str(path))


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """The first problem of a pydantic error as `source: field.path: message`, plus a count of the rest.

    An unknown field close to a known one gets a suggestion; a required field that is missing while
    an unknown field beside it is close to its name is reported as that misspelling.
    """
    errors = exc.errors()
    first = _misspelt_required(errors) or errors[0]
    # pydantic marks a bad dict key with a "[key]" step: the key itself is the location
    location = ".".join(str(part) for part in first["loc"] if part != "[key]") or "(top level)"
    message = first["msg"]
    if first["type"] == "missing":
        message = "this field is required"
        if (typo := first.get("ctx", {}).get("misspelt")) is not None:
            message = f"this field is required; {typo!r} is not a field: did you mean {first['loc'][-1]}?"
            errors = [e for e in errors if e["loc"] != (*first["loc"][:-1], typo)]
    elif first["type"] == "extra_forbidden":
        guess = _closest(str(first["loc"][-1]), _fields_at(first["loc"][:-1]))
        message = (f"unknown field; did you mean {guess}?" if guess
                   else "unknown field; check its spelling against the documented spec fields")
    elif first["type"] == "enum" and "overrides" in location:
        valid = ", ".join(c.value for c in Category)
        message = f"unknown failure category {first.get('input')!r}; use one of: {valid}"
    elif first["type"] in ("finite_number",):
        message = "must be a finite number of seconds, e.g. 3600 (leave it out for no limit)"
    elif first["type"] == "int_type" and isinstance(first.get("input"), bool):
        message = f"expected a whole number, got {str(first['input']).lower()}; e.g. 8"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    if not first["loc"] and re.match(r"[a-z_]+: ", message):  # a check across fields names its field itself
        return f"{source}: {message}{more}"
    return f"{source}: {location}: {message}{more}"


def _closest(word: str, known: Sequence[str]) -> str | None:
    """The known field `word` most likely misspells, if any is close enough."""
    found = difflib.get_close_matches(word.lower(), known, n=1, cutoff=0.7)
    return found[0] if found else None


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """The field names of the spec model at `loc` (e.g. ("retry",) -> RetrySpec's); [] where no model is."""
    model: type[BaseModel] | None = TrainingSpec
    for part in loc:
        if model is not None and part in model.model_fields:  # a dict key step (a category) keeps the model
            annotation = model.model_fields[str(part)].annotation
            model = next((a for a in (annotation, *typing.get_args(annotation))
                          if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(model.model_fields) if model is not None else []


def _misspelt_required(errors: Sequence[Any]) -> Any:
    """A "missing" error whose field an unknown field beside it misspells, marked with that spelling."""
    for missing in errors:
        if missing["type"] != "missing":
            continue
        for extra in errors:
            if (extra["type"] == "extra_forbidden" and tuple(extra["loc"][:-1]) == tuple(missing["loc"][:-1])
                    and _closest(str(extra["loc"][-1]), [str(missing["loc"][-1])])):
                return {**missing, "ctx": {"misspelt": str(extra["loc"][-1])}}
    return None
