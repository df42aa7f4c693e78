"""Serve trainguard's flows from this machine: `python -m deployments.serve`.

The served `train-attempt/local` deployment is what the attempt flow's state hooks re-schedule, so
retries come back to this process; `training-run/local` runs whole runs in one flow run;
`retry-controller/local` is what the automations of `trainguard setup` run for dead attempts. For a
work pool instead of a long-running process, use `prefect deploy` with `prefect.yaml`.
"""

from __future__ import annotations

import argparse
from typing import cast

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.attempt import train_attempt
from flows.controller import retry_controller
from flows.run import training_run

ATTEMPT_DEPLOYMENT = "train-attempt/local"
CONTROLLER_DEPLOYMENT = "retry-controller/local"


def deployments(tags: list[str]) -> list[RunnerDeployment]:
    """The deployments this module serves."""
    made = [
        train_attempt.to_deployment(
            name="local", tags=tags, description="One training attempt; failed attempts schedule the next."
        ),
        training_run.to_deployment(
            name="local", tags=tags, description="A whole training run, attempts looped in one flow run."
        ),
        retry_controller.to_deployment(
            name="local", tags=tags, description="Recovers a dead attempt and schedules its successor once.",
        ),
    ]
    return [cast(RunnerDeployment, deployment) for deployment in made]  # called synchronously: never coroutines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tag", action="append", default=["trainguard"])
    parser.add_argument("--limit", type=int, default=4, help="flow runs at once")
    args = parser.parse_args()
    serve(*deployments(args.tag), limit=args.limit)


if __name__ == "__main__":
    main()
