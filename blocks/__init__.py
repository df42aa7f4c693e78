"""Blocks: the configuration users edit in the Prefect UI (backends, evidence store, retry policy).

Blocks hold configuration and build adapters through factory methods; they hold no workflow logic.
Loading by reference happens at run time (`load_backend`, `load_evidence`), never at import time.
"""

from __future__ import annotations

from blocks.backends import LocalProcessBackend
from blocks.evidence import EvidenceFolder
from blocks.kubernetes import KubernetesJobBackend
from blocks.loading import BlockReferenceError, load_backend, load_evidence
from blocks.retry import RetryPolicy, resolve_policy
from blocks.slurm import SlurmBackend

__all__ = [
    "BlockReferenceError",
    "EvidenceFolder",
    "KubernetesJobBackend",
    "LocalProcessBackend",
    "RetryPolicy",
    "SlurmBackend",
    "load_backend",
    "load_evidence",
    "resolve_policy",
]
