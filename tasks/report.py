"""The report tasks: publish an attempt's report, the run's report and its attempts table."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainguard.core.reports import attempt as attempt_report, run as run_report
from trainguard.core.attempt import AttemptSummary


def artifact_key(run_id: str) -> str:
    """The run's artifact key prefix (artifact keys are lowercase letters, digits and dashes)."""
    return run_id.lower().replace("_", "-").replace(".", "-")


def publish_run_report(summaries: list[AttemptSummary]) -> None:
    """The run's report (timeline and progress chart), one Markdown artifact keyed by run."""
    create_markdown_artifact(
        key=f"{artifact_key(summaries[-1].run_id)}-report",
        markdown=run_report.render_run(summaries),
        description=f"trainguard run {summaries[-1].run_id}: timeline of attempts",
    )


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(summary: AttemptSummary, earlier: list[AttemptSummary]) -> None:
    """The run's report, one Markdown artifact per attempt and one table of all attempts, keyed by run."""
    key = artifact_key(summary.run_id)
    publish_run_report([*earlier, summary])
    create_markdown_artifact(
        key=f"{key}-attempt-{summary.attempt}",
        markdown=attempt_report.render_attempt(summary, earlier),
        description=f"trainguard attempt {summary.attempt} of {summary.run_id}",
    )
    create_table_artifact(
        key=f"{key}-attempts",
        table=[attempt_report.table_row(s) for s in [*earlier, summary]],
        description=f"All attempts of trainguard run {summary.run_id}",
    )
