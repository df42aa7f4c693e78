"""Loading backend and evidence blocks by reference, whatever their type.

A reference is Prefect's `block-type-slug/block-name`. A bare name still means a local-process
backend (or an evidence folder), the only types that existed before the seam. The loaded block must
have the factory the flow calls (`backend()` or `store()`); anything else is refused in one line.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

from prefect.blocks.core import Block

import blocks.backends as _backends  # the defaults when no reference is given
import blocks.evidence as _evidence
from trainguard.core.backends.base import Backend
from trainguard.core.stores.base import EvidenceStore


# Block types whose modules are imported only when a reference names them: slug -> (module, class).
ON_DEMAND = {
    "trainguard-kubernetes-job-backend": ("blocks.kubernetes", "KubernetesJobBackend"),
    "trainguard-slurm-backend": ("blocks.slurm", "SlurmBackend"),
}
# Every trainguard block type, the same way. A block is loaded through its own class: `Block.load`
# first imports every installed Prefect collection (prefect-kubernetes alone costs ~1.4 CPU s),
# which a local attempt's flow process never needs.
OWN_TYPES = {
    **ON_DEMAND,
    "trainguard-local-process-backend": ("blocks.backends", "LocalProcessBackend"),
    "trainguard-evidence-folder": ("blocks.evidence", "EvidenceFolder"),
    "trainguard-s3-evidence-store": ("blocks.evidence", "S3EvidenceStore"),
    "trainguard-retry-policy": ("blocks.retry", "RetryPolicy"),
}


class BlockReferenceError(ValueError):
    """A block reference names no usable block; the message says which and how to fix it."""


def _load(reference: str, default_slug: str, field: str) -> Block:
    ref = reference if "/" in reference else f"{default_slug}/{reference}"
    slug, name = ref.split("/", 1)
    try:
        if slug in OWN_TYPES:
            module, cls = OWN_TYPES[slug]
            block: Block = getattr(importlib.import_module(module), cls).load(name)
            return block
        return cast(Block, Block.load(ref))  # another library's block type: Prefect finds its class
    except ValueError as exc:
        raise BlockReferenceError(
            f"{field} {reference!r}: no such block ({exc}); save one, or pass 'block-type-slug/name' "
            "as shown by `prefect block ls`"
        ) from None


def backend_reference(backend_block: str | None, spec: Any) -> str | None:
    """The backend block an attempt runs on: its `backend_block` parameter, else the one its spec names.

    The attempt flow, the crash hook and the retry controller all ask this, so an attempt is
    recovered on the backend it ran on. `spec` may be a parsed spec or its parameter form (a dict).
    """
    if backend_block:
        return backend_block
    named = spec.get("backend") if isinstance(spec, Mapping) else getattr(spec, "backend", None)
    return str(named) if named else None


def load_backend(reference: str | None) -> Backend:
    """The backend adapter of the block `reference` names; the local-process default when None."""
    if not reference:
        return _backends.LocalProcessBackend().backend()
    block = _load(reference, _backends.LocalProcessBackend.get_block_type_slug(), "backend_block")
    factory = getattr(block, "backend", None)
    if not callable(factory):
        raise BlockReferenceError(
            f"backend_block {reference!r} is a {type(block).__name__}, not a trainguard backend; "
            "name a trainguard-*-backend block"
        )
    built = factory()
    if not isinstance(built, Backend):
        raise BlockReferenceError(f"backend_block {reference!r}: its backend() does not build a trainguard backend")
    return built


def load_evidence(reference: str | None, *, no_time_limit: bool = False) -> EvidenceStore:
    """The evidence store of the block `reference` names; the evidence-folder default when None.

    ``no_time_limit`` lifts the store's upload time budget, for a command that may wait on S3 as
    long as it takes (`trainguard evidence flush`).
    """
    if not reference:
        return _evidence.EvidenceFolder().store()
    block = _load(reference, _evidence.EvidenceFolder.get_block_type_slug(), "evidence_block")
    factory = getattr(block, "store", None)
    if not callable(factory):
        raise BlockReferenceError(
            f"evidence_block {reference!r} is a {type(block).__name__}, not a trainguard evidence store; "
            "name a trainguard evidence block"
        )
    store: EvidenceStore = factory(no_time_limit=True) if no_time_limit else factory()
    return store


__all__ = ["BlockReferenceError", "backend_reference", "load_backend", "load_evidence"]
