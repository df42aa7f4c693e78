"""The report task: publish an attempt's report and the run's attempts table as Prefect artifacts."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainguard.core import report
from trainguard.core.attempt import AttemptSummary


@task(name="publish_report", cache_policy=NO_CACHE)
def publish_report(summary: AttemptSummary, earlier: list[AttemptSummary]) -> None:
    """One Markdown artifact per attempt plus one table of all attempts, keyed by run."""
    key = summary.run_id.lower().replace("_", "-").replace(".", "-")
    create_markdown_artifact(
        key=f"{key}-attempt-{summary.attempt}",
        markdown=report.render_attempt(summary, earlier),
        description=f"trainguard attempt {summary.attempt} of {summary.run_id}",
    )
    create_table_artifact(
        key=f"{key}-attempts",
        table=[report.table_row(s) for s in [*earlier, summary]],
        description=f"All attempts of trainguard run {summary.run_id}",
    )
