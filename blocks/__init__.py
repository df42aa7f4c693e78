"""Blocks: the configuration users edit in the Prefect UI (backends, evidence store, retry policy).

Blocks hold configuration and build adapters through factory methods; they hold no workflow logic.
Loading by name happens at run time (`load_blocks`), never at import time.
"""

from __future__ import annotations

from blocks.backends import LocalProcessBackend
from blocks.evidence import EvidenceFolder
from blocks.retry import RetryPolicy, resolve_policy


def load_backend(name: str | None) -> LocalProcessBackend:
    return LocalProcessBackend.load(name) if name else LocalProcessBackend()


def load_evidence(name: str | None) -> EvidenceFolder:
    return EvidenceFolder.load(name) if name else EvidenceFolder()


__all__ = [
    "EvidenceFolder",
    "LocalProcessBackend",
    "RetryPolicy",
    "load_backend",
    "load_evidence",
    "resolve_policy",
]
