"""Running trainguard from a notebook: start a run, wait for it, and read its attempts and report.

Jupyter runs every cell inside an event loop, and there Prefect's dual sync/async functions
(`State.result`, `Artifact.get`) hand back coroutines instead of values. Everything here asks for
the synchronous form explicitly, so the same code reads the same values in a notebook, a script
and a test. `NotebookRun` shows itself as the run report when it is a cell's last value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from prefect.artifacts import Artifact
from prefect.client.schemas.objects import State

from flows.run import training_run
from tasks.report import artifact_key
from trainguard.core.reports import attempt as attempt_report
from trainguard.core.attempt import AttemptSummary, new_run_id
from trainguard.core.spec import TrainingSpec, parse_spec


def state_result(state: State) -> Any:
    """A final state's result (or its exception), also inside a running event loop."""
    return state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]  # async_dispatch's switch


def run_report(run_id: str) -> str:
    """The run's report artifact (Markdown), or '' if none was published."""
    artifact = cast(Artifact | None, Artifact.get(f"{artifact_key(run_id)}-report", _sync=True))  # type: ignore[call-arg]
    return str(artifact.data) if artifact is not None else ""


@dataclass
class NotebookRun:
    """A finished run as a notebook shows it: its final state, its attempts and its report."""

    run_id: str
    state: str
    message: str
    attempts: list[AttemptSummary] = field(default_factory=list)
    report: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state == "Completed"

    def table(self) -> list[dict[str, str]]:
        """The attempts table, one dict per attempt (`pandas.DataFrame(run.table())` if you like)."""
        return [attempt_report.table_row(summary) for summary in self.attempts]

    def _repr_markdown_(self) -> str:
        return self.report or f"**{self.run_id}**: {self.state}: {self.message}"


def run_training(spec: TrainingSpec | dict[str, Any], *, run_id: str | None = None, **blocks: str | None) -> NotebookRun:
    """Run `spec` here, attempt after attempt, and return what a notebook shows of it.

    Args:
        spec: the run spec, as a `TrainingSpec` or as the dict a YAML spec file holds.
        run_id: the run's id; a fresh one from the spec's name when absent.
        blocks: `backend_block`, `evidence_block`, `retry_policy_block`, `rules_file`, as for the flow.
    """
    spec = spec if isinstance(spec, TrainingSpec) else parse_spec(spec)
    run_id = run_id or new_run_id(spec.name)
    state = training_run(spec, run_id=run_id, return_state=True, **blocks)
    history = state_result(state)
    attempts = [AttemptSummary.from_dict(item) for item in history] if isinstance(history, list) else []
    return NotebookRun(run_id=run_id, state=str(state.name), message=str(state.message or ""),
                       attempts=attempts, report=run_report(run_id))
