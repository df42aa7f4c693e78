"""`trainguard setup`: make a Prefect server ready for trainguard, idempotently.

Registers the block types (so their forms appear in the UI), creates the retry-controller
deployment, and creates the automations that run it for crashed, failed and silent attempts.
"""

from __future__ import annotations

import typer

from trainguard.cli.typer_app import app
from trainguard.cli.output import console, fail


@app.command("setup")
def setup(
    controller_deployment: str = typer.Option(
        "retry-controller/local", "--controller-deployment",
        help="The retry-controller deployment the automations run: the default is created here and run by "
        "`python -m deployments.serve`; another (e.g. retry-controller/safety-net from prefect.yaml) must exist."),
    heartbeat_seconds: int = typer.Option(
        180, "--heartbeat-seconds",
        help="PREFECT_FLOWS_HEARTBEAT_FREQUENCY on the workers that run attempts (Prefect's default, 180, unless "
        "they set it): an attempt without a heartbeat for three periods is marked Crashed and recovered."),
) -> None:
    """Register trainguard's block types, the retry-controller deployment and its automations (safe to repeat)."""
    from prefect.exceptions import PrefectException

    from deployments.setup import SetupError, run_setup

    try:
        result = run_setup(controller_deployment, heartbeat_seconds)
    except SetupError as exc:
        fail(str(exc))
    except (PrefectException, RuntimeError, OSError, ValueError) as exc:
        fail(f"setup could not finish on the Prefect API ({type(exc).__name__}: {exc}); "
             "check PREFECT_API_URL and that the server runs", code=1)
    console.print(f"block types: {', '.join(result.block_types)}", highlight=False)
    console.print(f"retry controller: deployment {result.controller} ({result.controller_id})", highlight=False)
    for name, automation_id, what in result.automations:
        console.print(f"automation {what}: {name} ({automation_id})", highlight=False)
