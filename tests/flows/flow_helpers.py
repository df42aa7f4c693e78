"""Helpers shared by the flow tests: running a spec, specs for the tiny trainer, lineage queries, waiting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
from prefect.exceptions import ObjectNotFound
from runs import attempt_runs, tiny_spec  # noqa: F401  (re-exported for the tests here)

from flows.run import training_run
from trainguard.core.attempt import AttemptSummary
from trainguard.core.spec import parse_spec


ROOT = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]


def run(spec: dict[str, Any], blocks: dict[str, Any], run_id: str, *, as_summaries: bool = False,
        evidence_block: str | None = None) -> tuple[Any, list[Any]]:
    """The run flow of ``spec`` on the blocks' backend and evidence store (``evidence_block`` instead, when
    given): its final state and each attempt's verdict as the flow returned it, a dict, or an
    `AttemptSummary` with ``as_summaries``."""
    state = training_run(parse_spec(spec), run_id=run_id, backend_block=blocks["backend_block"],
                         evidence_block=evidence_block or blocks["evidence_block"], return_state=True)
    history = state.result(raise_on_failure=False)
    return state, [AttemptSummary.from_dict(item) for item in history] if as_summaries else history


def attempt_dir(evidence_root: Path, run_id: str, attempt: int) -> Path:
    return evidence_root / "runs" / run_id / f"attempt-{attempt}"


def subprocess_env(api_url: str) -> dict[str, str]:
    """The environment of a Prefect process the tests start against the test server."""
    return {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONPATH": str(ROOT),
    }


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def read_run(flow_run_id: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def deployment_exists(name: str) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
            return True
        except ObjectNotFound:
            return False


def prefect_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The `prefect` command from the project root; fails the test with its output."""
    done = subprocess.run([*PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def prefect_records(run_id: str) -> tuple[list[str], list[str], list[str]]:
    """Artifact bodies, flow-run parameters and log messages the server holds for ``run_id``."""
    key = run_id.lower()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=key)))
        runs = attempt_runs(run_id)
        parents = [client.read_flow_run(r.parent_task_run_id and client.read_task_run(r.parent_task_run_id).flow_run_id)
                   for r in runs if r.parent_task_run_id]
        all_runs = [*runs, *parents]
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in all_runs])))
    artifacts = [a.data if isinstance(a.data, str) else json.dumps(a.data) for a in found]
    parameters = [json.dumps(r.parameters, default=str) for r in all_runs]
    assert artifacts and parameters and logs
    return artifacts, parameters, [entry.message for entry in logs]


def cells(table: str, header: str) -> str:
    """The text of one column of a rich table, its wrapped lines joined by spaces."""
    heading = next(line for line in table.splitlines() if line.startswith("┃"))
    column = [name.strip() for name in heading.split("┃")].index(header)
    rows = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    return " ".join(" ".join(row[column].split()) for row in rows if len(row) > column).strip()
