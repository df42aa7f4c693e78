"""Secrets a run spec references in ``secret_env``, resolved when the attempt starts.

A spec names where each secret lives (a Prefect Secret block, or ``env:NAME`` for a variable of
the worker's environment), never its value, so no secret is stored as a flow-run parameter. The
values resolved here go straight into the training command's environment and are registered with
the masker, so nothing trainguard writes or shows repeats them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, cast

from trainguard.core import masking


class SecretEnvError(ValueError):
    """A referenced secret cannot be resolved; the message names the variable and the fix."""


def resolve_secret_env(references: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the spec's ``secret_env``, by variable name; each is registered for masking.

    Raises:
        SecretEnvError: A block or a worker variable is missing (one line naming it).
    """
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for name, reference in references.items():
        if reference.startswith("env:"):
            variable = reference.removeprefix("env:")
            if variable not in environ:
                raise SecretEnvError(
                    f"secret_env.{name}: the worker's environment has no {variable}; set it where the flow runs"
                )
            values[name] = environ[variable]
        else:
            values[name] = _secret_block(name, reference)
    masking.register(values.values())
    return values


def _secret_block(name: str, block_name: str) -> str:
    from prefect.blocks.system import Secret

    try:
        value = cast(Secret[Any], Secret.load(block_name)).get()
    except ValueError as exc:
        raise SecretEnvError(
            f"secret_env.{name}: no Prefect Secret block named {block_name!r} ({exc}); "
            f"create it with Secret(value=...).save({block_name!r})"
        ) from None
    return value if isinstance(value, str) else json.dumps(value)
