"""An attempt's verdict kept beside its evidence, and read back: the one place that knows how.

Whoever judges an attempt (the attempt flow, the crash hook and the retry controller, `trainguard
run` when it stops or resumes) keeps the verdict with `keep`: ``verdict.json`` (and any extra items)
listed in the attempt's manifest, the attempt's objects tagged with its outcome (`retention`), its
record in the verdict index, the space `manifest.reserve_space` set aside given back, and a held store's
uploads started (`afterupload`). Nothing here raises because of storage: what could not be kept comes
back as the summary's storage problems and as lines to warn with. The verdict as kept is turned into its
plain data once, here: the flow's result and the events carry that one value. `read` gives a kept
verdict back as an `AttemptSummary`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainguard.core.attempt import AttemptSummary
from trainguard.core.evidence import afterupload, bundles, index, retention
from trainguard.core.evidence.manifest import VERDICT, Manifest, attempt_prefix, read_manifest, release_space
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore


# Held by whoever keeps a verdict in this process; `last_word` keeps it for good.
_KEEPING = threading.RLock()


def last_word() -> None:
    """From now on only the calling thread keeps verdicts in this process.

    For a stop that ends the process from a side thread (`trainguard run` when its temporary
    server dies): the attempt flow may still be running in the main thread, with the training the
    stop just ended. Its verdict would then overwrite the stop's; after this call its `keep` waits
    for the process to end instead. A verdict being kept when this is called is kept first.
    """
    _KEEPING.acquire()


@dataclass(frozen=True)
class Kept:
    """What keeping a verdict left.

    Attributes:
        summary: The verdict as kept, with the storage problems and the upload status keeping found.
        data: ``summary`` as plain data (`AttemptSummary.to_dict`): what the flow returns and the events carry.
        manifest: The attempt's manifest as it now stands (None when it could not be read or written).
        index_key: The verdict index record's key (it goes up with the bundle).
        warnings: What went wrong on the way, one line each, for the caller's log.
    """

    summary: AttemptSummary
    data: dict[str, Any]
    manifest: Manifest | None
    index_key: str
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(cls, summary: AttemptSummary, manifest: Manifest | None, index_key: str,
           warnings: tuple[str, ...] = ()) -> Kept:
        """``summary`` kept as it stands, its plain data taken once."""
        return cls(summary, summary.to_dict(), manifest, index_key, warnings)


def keep(store: EvidenceStore, summary: AttemptSummary, source: str, *, manifest: Manifest | None = None,
         items: Mapping[str, bytes] | None = None, held: bool = False, now: datetime | None = None) -> Kept:
    """Keep ``summary`` as the attempt's verdict beside its evidence; never raises.

    Args:
        store: The evidence store.
        summary: The verdict (the summary with its decision).
        source: Who reached it ("flow", "retry-controller", "cli"), as the manifest lists it.
        manifest: The manifest as its writer has it; read back from the store when None.
        items: More evidence items to keep with it (the whole stacks' table).
        held: The store holds its uploads until the verdict is kept (`afterupload`).
        now: When the verdict was reached.
    """
    with _KEEPING:
        return _keep(store, summary, source, manifest, items, held, now)


def _keep(store: EvidenceStore, summary: AttemptSummary, source: str, manifest: Manifest | None,
          items: Mapping[str, bytes] | None, held: bool, now: datetime | None) -> Kept:
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    stamp = (now or datetime.now(UTC)).isoformat()
    warnings: list[str] = []
    try:
        current = manifest if manifest is not None else read_manifest(store, summary.run_id, summary.attempt)
        manifest = retention.add_verdict(store, current, data, summary.succeeded, source, stamp, items)
        problem = None
    except Exception as exc:  # store what can be stored, and say what could not
        if not isinstance(exc, EvidenceNotFound):
            warnings.append(f"could not keep the verdict with its evidence: {type(exc).__name__}: {exc}")
        problem = _alone(store, summary, data, items or {}, exc)
        warnings.append(problem)
    upload = bundles.upload_status(store, manifest, held) if manifest is not None else None
    if upload is not None and upload.spooled and not held:
        warnings.append(f"the verdict waits in the local spool with {len(upload.spooled)} evidence items "
                        f"({upload.upload_error}); `trainguard evidence flush` uploads them")
    key, index_problem = index.keep(store, summary)
    if index_problem:
        warnings.append(f"{index_problem}; the verdict itself is kept, only the fleet view misses it")
    release_space(store, summary.run_id, summary.attempt)
    if held:  # the verdict index's record goes up with the bundle
        afterupload.start(store, summary.run_id, summary.attempt, manifest.to_json() if manifest else None, (key,))
    kept = summary.with_upload(upload) if upload is not None else summary
    return Kept.of(kept.with_storage_problems(problem, index_problem), manifest, key, tuple(warnings))


def _alone(store: EvidenceStore, summary: AttemptSummary, data: bytes, items: Mapping[str, bytes],
           why: Exception) -> str:
    """Store the verdict (and ``items``) without listing them; one line saying what was and was not stored."""
    prefix = attempt_prefix(summary.run_id, summary.attempt)
    try:
        store.put_bytes(f"{prefix}/{VERDICT}", data)
    except Exception as exc:
        return f"{VERDICT} could not be stored: {type(exc).__name__}: {exc}"
    for name, item in items.items():
        try:
            store.put_bytes(f"{prefix}/{name}", item)
        except Exception:  # the verdict is what matters; its extras are said with it
            continue
    return f"{VERDICT} was stored but is not listed in the manifest: {type(why).__name__}: {why}"


def read(store: EvidenceStore, run_id: str, attempt: int) -> AttemptSummary | None:
    """The attempt's kept verdict, or None when it was never judged (or what is kept is not a verdict)."""
    try:
        data = json.loads(store.get_bytes(f"{attempt_prefix(run_id, attempt)}/{VERDICT}"))
    except (EvidenceNotFound, ValueError, OSError, RecursionError):
        return None
    return AttemptSummary.from_dict(data) if isinstance(data, dict) else None
