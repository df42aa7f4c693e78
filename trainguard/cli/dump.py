"""`trainguard dump RUN`: every rank's stack of a running attempt, now, without stopping it.

The backend asks the attempt's entrypoint (`DumpsStacks`): the local backend by SIGQUIT to the
entrypoint its `process.json` names (checked to be that attempt's entrypoint first), Slurm by the
`dump-stacks` file in every task's folder on the shared filesystem, which each entrypoint polls.
The entrypoint takes the stacks beside the run (py-spy, else each rank's faulthandler) into the
attempt's `stacks/`; this waits for them and says where they are. Reading them is triage's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from trainguard_entrypoint.files import read_json_object

from trainguard.cli.output import fail, plain, say
from trainguard.cli.recent import backend_for
from trainguard.cli.typer_app import app
from trainguard.core.home import data_path
from trainguard.core import ids
from trainguard.core.backends import forensics, workspace
from trainguard.core.backends.capabilities import Supervises


@app.command("dump")
def dump(
    run_id: str = typer.Argument(..., help="The run whose running attempt to ask."),
    attempt: int | None = typer.Option(None, min=1, help="The attempt (default: the run's newest)."),
    work: Path = typer.Option(Path("trainguard-data/work"), callback=data_path, help="Work folder of the local backend (without --backend)."),
    backend_block: str | None = typer.Option(
        None, "--backend", help="A saved backend block ('block-type-slug/name'): a Slurm backend's, for example."),
    wait: float = typer.Option(60.0, min=0, help="Seconds to wait for the stacks to be written (0: do not wait)."),
) -> None:
    """Take every rank's stack of a running attempt now, without stopping it."""
    try:
        ids.validate_run_id(run_id)
    except ids.InvalidId as exc:
        fail(f"RUN: {exc}")
    backend = backend_for(work, backend_block)
    if not isinstance(backend, forensics.DumpsStacks) or not isinstance(backend, Supervises):
        fail(f"the {backend.kind} backend cannot be asked for stacks from here; on Kubernetes, create the file "
             "dump-stacks in the attempt's folder on its volume (the entrypoint polls for it)")
    numbers = backend.attempts(run_id)
    chosen = attempt or (numbers[-1] if numbers else None)
    if chosen is None or chosen not in numbers:
        which = f"attempt {chosen}" if chosen else "attempt"
        fail(f"run {run_id} has no {which} in {backend_block or work}; check the run id with `trainguard runs`")
    since = time.time() - 1.0
    try:
        how = backend.dump_stacks(run_id, chosen)
    except forensics.NotRunning as exc:
        fail(f"run {run_id}, attempt {chosen}: {exc}", code=1)
    say(plain(how))
    folder = backend.attempt_folder(run_id, chosen)
    if wait and not forensics.wait_for_stacks(folder, since, wait):
        fail(f"no stacks in {folder / workspace.STACKS} after {wait:g}s; the entrypoint's log says why", code=1)
    say(plain(_summary(folder) if wait else f"the stacks go to {folder / workspace.STACKS}"))


def _summary(folder: Path) -> str:
    """How many ranks' stacks were had, and where (the index is the job's file: read bounded)."""
    index = read_json_object(folder / workspace.STACKS / workspace.INDEX, folder) or {}
    found = index.get("ranks")
    ranks: dict[str, object] = found if isinstance(found, dict) else {}
    had = sum(1 for entry in ranks.values() if isinstance(entry, dict) and bool(entry.get("file")))
    seconds = index.get("seconds")
    took = f" in {seconds:.1f}s" if isinstance(seconds, int | float) else ""
    return f"{had} of {len(ranks)} ranks' stacks{took}: {folder / workspace.STACKS} ({json.dumps(index.get('why', ''))})"
