"""`trainguard setup`'s work: block types, the retry-controller deployment and the automations.

Everything here is idempotent: block types are registered again with their current forms, the
controller deployment is created or updated by name, and automations are replaced by name.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from prefect import get_client
from prefect.blocks.core import Block
from prefect.settings import get_current_settings

import blocks
from deployments import automations
from flows.controller import retry_controller

CONTROLLER_NAME = "local"
CONTROLLER_ENTRYPOINT = "flows/controller.py:retry_controller"
PROJECT_DIR = Path(__file__).resolve().parent.parent


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


def ensure_controller(work_pool: str | None) -> tuple[str, UUID]:
    """The retry-controller deployment, created or updated; (full name, id).

    Without a work pool it is `retry-controller/local`, run by `python -m deployments.serve`;
    with one, `retry-controller/<pool>` runs on that pool's workers from this checkout.
    """
    if work_pool is None:
        deployment_id = retry_controller.to_deployment(
            name=CONTROLLER_NAME, tags=["trainguard"], description="Recovers a dead attempt and schedules its successor once.",
        ).apply()
        return f"retry-controller/{CONTROLLER_NAME}", deployment_id
    source = retry_controller.from_source(source=str(PROJECT_DIR), entrypoint=CONTROLLER_ENTRYPOINT)
    deployment_id = source.deploy(name=work_pool, work_pool_name=work_pool, tags=["trainguard"], build=False,
                                  push=False, print_next_steps=False, ignore_warnings=True)
    return f"retry-controller/{work_pool}", deployment_id


def run_setup(work_pool: str | None = None) -> SetupResult:
    """Register block types, create the controller deployment and (re)create the automations."""
    result = SetupResult(block_types=register_block_types())
    result.controller, result.controller_id = ensure_controller(work_pool)
    heartbeat = get_current_settings().flows.heartbeat_frequency or 180
    with get_client(sync_client=True) as client:
        result.automations = automations.ensure_automations(
            client, automations.automations(result.controller_id, heartbeat))
    return result
