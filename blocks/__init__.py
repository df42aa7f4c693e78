"""Blocks: the configuration users edit in the Prefect UI (backends, evidence store, retry policy).

Blocks hold configuration and build adapters through factory methods; they hold no workflow logic.
Loading by reference happens at run time (`load_backend`, `load_evidence`), never at import time.
The Kubernetes and Slurm blocks are imported when first named: prefect-kubernetes alone costs a
flow process about 1.4 CPU seconds to import, which an attempt on another backend never needs.
"""

from __future__ import annotations

import importlib
from typing import Any

from blocks.backends import LocalProcessBackend
from blocks.evidence import EvidenceFolder
from blocks.loading import ON_DEMAND, BlockReferenceError, backend_reference, load_backend, load_evidence
from blocks.retry import RetryPolicy, resolve_policy


def __getattr__(name: str) -> Any:
    module = next((m for m, cls in ON_DEMAND.values() if cls == name), None)
    if module is None:
        raise AttributeError(f"module 'blocks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BlockReferenceError",
    "EvidenceFolder",
    "KubernetesJobBackend",
    "LocalProcessBackend",
    "RetryPolicy",
    "SlurmBackend",
    "backend_reference",
    "load_backend",
    "load_evidence",
    "resolve_policy",
]
