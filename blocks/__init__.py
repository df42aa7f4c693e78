"""Blocks: the configuration users edit in the Prefect UI (backends, evidence store, retry policy).

Blocks hold configuration and build adapters through factory methods; they hold no workflow logic.
Loading by reference happens at run time (`load_backend`, `load_evidence`), never at import time.
Every name here is imported when first used: Prefect's block machinery costs a command about two
seconds to import, which `trainguard evidence show` on a folder never needs (it builds its store
through `blocks.factories`), and prefect-kubernetes alone costs a flow process about 1.4 CPU seconds,
which an attempt on another backend never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names are, for the type checker; at run time they come on first use
    from blocks.backends import LocalProcessBackend
    from blocks.evidence import EvidenceFolder
    from blocks.kubernetes import KubernetesJobBackend
    from blocks.loading import BlockReferenceError, backend_reference, load_backend, load_evidence
    from blocks.retry import RetryPolicy, resolve_policy
    from blocks.slurm import SlurmBackend

# name -> the module that defines it
_WHERE = {
    "LocalProcessBackend": "blocks.backends",
    "EvidenceFolder": "blocks.evidence",
    "BlockReferenceError": "blocks.loading",
    "backend_reference": "blocks.loading",
    "load_backend": "blocks.loading",
    "load_evidence": "blocks.loading",
    "RetryPolicy": "blocks.retry",
    "resolve_policy": "blocks.retry",
    "KubernetesJobBackend": "blocks.kubernetes",
    "SlurmBackend": "blocks.slurm",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'blocks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BlockReferenceError", "EvidenceFolder", "KubernetesJobBackend", "LocalProcessBackend", "RetryPolicy",
    "SlurmBackend", "backend_reference", "load_backend", "load_evidence", "resolve_policy",
]
