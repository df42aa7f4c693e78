"""`trainguard setup`'s work: block types, the retry-controller deployment and the automations.

Everything here is idempotent: block types are registered again with their current forms, the
controller deployment is created or updated by name, and automations are replaced by name.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import cast
from uuid import UUID

from prefect import get_client
from prefect.deployments.runner import RunnerDeployment
from prefect.blocks.core import Block
from prefect.exceptions import ObjectNotFound

import blocks
from deployments import automations
from flows.controller import retry_controller

CONTROLLER = "retry-controller/local"
# Prefect's own default of PREFECT_FLOWS_HEARTBEAT_FREQUENCY (3.6.22 and later), and its minimum.
HEARTBEAT_SECONDS = 180
MIN_HEARTBEAT_SECONDS = 30


class SetupError(ValueError):
    """Setup cannot go on; the message names the option and the fix."""


@dataclass
class SetupResult:
    """What setup did, for the command to print."""

    block_types: list[str] = field(default_factory=list)
    controller: str = ""
    controller_id: UUID | None = None
    automations: list[tuple[str, UUID, str]] = field(default_factory=list)


def block_classes() -> list[type[Block]]:
    """Every trainguard block type in the `blocks` package (backends, evidence stores, policies)."""
    found: dict[str, type[Block]] = {}
    for info in pkgutil.iter_modules(blocks.__path__):
        module = importlib.import_module(f"blocks.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            slug = cls.__dict__.get("_block_type_slug")
            if issubclass(cls, Block) and isinstance(slug, str) and slug.startswith("trainguard-"):
                found[slug] = cls
    return [found[slug] for slug in sorted(found)]


def register_block_types() -> list[str]:
    """Register (or refresh) every trainguard block type and its form; the slugs."""
    for cls in block_classes():
        cls.register_type_and_schema()
    return [cls.get_block_type_slug() for cls in block_classes()]


def ensure_controller(name: str = CONTROLLER) -> tuple[str, UUID]:
    """The retry-controller deployment the automations run; (full name, id).

    The default, `retry-controller/local`, is created (or updated) here and run by
    `python -m deployments.serve`. Any other name must exist already, e.g. `retry-controller/safety-net`
    from `prefect deploy --all`.
    """
    if name == CONTROLLER:
        deployment = cast(RunnerDeployment, retry_controller.to_deployment(
            name=CONTROLLER.split("/", 1)[1], tags=["trainguard"],
            description="Recovers a dead attempt and schedules its successor once.",
        ))
        return name, cast(UUID, deployment.apply())
    with get_client(sync_client=True) as client:
        try:
            return name, client.read_deployment_by_name(name).id
        except ObjectNotFound:
            raise SetupError(f"--controller-deployment {name!r}: no such deployment; create it with "
                             "`prefect deploy --all` (prefect.yaml has retry-controller/safety-net) or leave the default") from None


def run_setup(controller: str = CONTROLLER, heartbeat_seconds: int = HEARTBEAT_SECONDS) -> SetupResult:
    """Register block types, find or create the controller deployment and (re)create the automations.

    Args:
        controller: The retry-controller deployment the automations run (see `ensure_controller`).
        heartbeat_seconds: PREFECT_FLOWS_HEARTBEAT_FREQUENCY *of the workers* that run attempts (not
            of this machine): a run is a zombie after three periods without a heartbeat.
    """
    if heartbeat_seconds < MIN_HEARTBEAT_SECONDS:
        raise SetupError(f"--heartbeat-seconds {heartbeat_seconds}: Prefect sends flow-run heartbeats at most every "
                         f"{MIN_HEARTBEAT_SECONDS} s; pass the workers' PREFECT_FLOWS_HEARTBEAT_FREQUENCY "
                         f"(Prefect's default is {HEARTBEAT_SECONDS})")
    result = SetupResult()
    result.controller, result.controller_id = ensure_controller(controller)  # a wrong name changes nothing
    result.block_types = register_block_types()
    with get_client(sync_client=True) as client:
        result.automations = automations.ensure_automations(
            client, automations.automations(result.controller_id, heartbeat_seconds))
    return result
