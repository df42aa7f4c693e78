"""The evidence task: freeze what the attempt left behind into the evidence store."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from blocks.evidence import EvidenceFolder
from trainguard.core import evidence, manifest
from trainguard.core.attempt import AttemptSummary
from trainguard.core.workspace import AttemptWorkspace


@task(name="collect_evidence", cache_policy=NO_CACHE)
def collect_evidence(
    store_block: EvidenceFolder, workspace: AttemptWorkspace, extra: dict[str, bytes] | None = None
) -> dict[str, Any]:
    """Copy logs, snapshots, crash report, checkpoint and core dumps to the store; never raise for a missing piece."""
    store = store_block.store()
    collected = evidence.collect_local_evidence(workspace, store, extra=extra)
    location = store.describe(manifest.attempt_prefix(workspace.run_id, workspace.attempt))
    absent = "; ".join(f"{item.name}: {item.reason}" for item in collected.missing)
    get_run_logger().info("kept %d evidence items in %s%s", len(collected.items), location,
                          f" (absent: {absent})" if absent else "")
    return {"location": location, "items": len(collected.items), "missing": len(collected.missing)}


@task(name="record_verdict", cache_policy=NO_CACHE)
def record_verdict(store_block: EvidenceFolder, summary: AttemptSummary) -> None:
    """Keep the attempt's classification and retry decision with its evidence (`verdict.json`)."""
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    now = datetime.now(timezone.utc).isoformat()
    manifest.add_items(store_block.store(), summary.run_id, summary.attempt, {"verdict.json": data}, "flow", now)
