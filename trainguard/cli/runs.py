"""`trainguard run` and `trainguard demo`: run attempts until success or the policy says stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import typer

from trainguard.cli.typer_app import app
from trainguard.cli.output import attempts_table, console, fail, plain, say
from trainguard.core.attempt import AttemptSummary
from trainguard.core.reports import attempt as attempt_report
from trainguard.core.spec import RetrySpec, SpecError, TrainingSpec, load_spec, parse_spec


_STORAGE_LINES = 4


@app.command("run")
def run(
    spec_file: Path = typer.Argument(..., help="YAML run spec: name, command, env, limits, retry."),
    backend: str | None = typer.Option(None, help="A saved backend block: slug/name (a bare name = local process)."),
    evidence: str | None = typer.Option(None, help="Name of a saved trainguard evidence block."),
    retry_policy: str | None = typer.Option(None, help="Name of a saved retry policy block (the spec's retry section wins)."),
    rules: Path | None = typer.Option(None, help="Your own triage rule file, layered over the shipped rules."),
    deployment: str | None = typer.Option(None, help="Submit to this train-attempt deployment instead of running here."),
    resume: str | None = typer.Option(None, help="Continue this run id: judge what its lost attempt left, then go on."),
    max_attempts: int | None = typer.Option(None, min=1, max=100, help="Attempts in a row without checkpoint "
                                            "progress (the spec's retry.max_attempts); raise it to --resume a run that "
                                            "spent its budget."),
    kubeconfig: Path | None = typer.Option(None, help="Run on this cluster as Kubernetes Jobs, without a saved block."),
    context: str | None = typer.Option(None, help="With --kubeconfig: the kubeconfig context."),
    namespace: str | None = typer.Option(None, help="With --kubeconfig: the namespace (default: default)."),
    image: str | None = typer.Option(None, help="With --kubeconfig: the training image (needs a Python 3)."),
    master_port: int | None = typer.Option(None, min=1, max=65535, help="With --kubeconfig: the port the ranks meet "
                                           "on (default 29500); pods sharing a host's network need one each."),
) -> None:
    """Run a training spec: attempts, evidence, triage and retries, with a table at the end."""
    try:
        spec = load_spec(spec_file)
    except SpecError as exc:
        fail(str(exc))
    if max_attempts is not None:
        retry = (spec.retry or RetrySpec()).model_copy(update={"max_attempts": max_attempts})
        spec = spec.model_copy(update={"retry": retry})
    if rules is not None and not rules.is_file():
        fail(f"--rules: no such file {rules}; pass the path of a YAML rule file")
    backend = backend or spec.backend
    if master_port is not None and kubeconfig is None:
        fail("--master-port goes with --kubeconfig; for a saved Kubernetes backend block, set its master_port")
    if kubeconfig is not None:
        from trainguard.cli.kube import quick_backend

        _start_server_first()
        backend = quick_backend(kubeconfig, context=context, namespace=namespace, image=image, master_port=master_port)
    if deployment:
        _submit(spec, deployment, backend, evidence, retry_policy)
        return
    _run_here(spec, backend=backend, evidence=evidence, retry_policy=retry_policy, rules=rules,
              resume=resume, spec_file=spec_file)


@app.command("demo")
def demo(
    delay: float = typer.Option(2.0, help="Backoff before the retry, in seconds."),
) -> None:
    """Run the embedded demo: a tiny CPU training run that fails, is triaged, resumes and succeeds."""
    from trainguard.demo import demo_spec

    spec = parse_spec(demo_spec(delay_seconds=delay), "demo")
    say(plain("trainguard demo", "bold"), ": ", " ".join(spec.command[1:]))
    _run_here(spec)


def _start_server_first() -> None:
    """Start Prefect's temporary server (when no PREFECT_API_URL is set) before anything else asks
    Prefect for one: saving a block would start it without the guard that keeps a Ctrl-C from it."""
    from trainguard.cli.server import start_temporary_server

    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    try:
        start_temporary_server()  # _run_here's own call then finds it running
    except (RuntimeError, OSError) as exc:
        fail(f"could not start a temporary Prefect server ({exc}); set PREFECT_API_URL or run `prefect server start`", code=1)


def _run_here(spec: TrainingSpec, **blocks: Any) -> None:
    # Without PREFECT_API_URL Prefect starts a local ephemeral server; its first start migrates
    # the database, which takes longer than Prefect's 20 s default on a busy 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from prefect.exceptions import TerminationSignal

    from flows.run import training_run
    from trainguard.cli import settle
    from trainguard.cli.server import start_temporary_server
    from trainguard.core.backends.waits import said_while, span
    from trainguard.core.attempt import new_run_id

    resume, spec_file = blocks.pop("resume", None), blocks.pop("spec_file", None)
    if resume:  # refused before a server is started for nothing
        settle.check_resume(spec, resume, blocks)
    try:
        with said_while(lambda line: say(line), lambda waited: f"trainguard: waiting {span(waited)} for the temporary "
                        "Prefect server to start (its first start sets up its database)"):
            server = start_temporary_server()
    except (RuntimeError, OSError) as exc:
        fail(f"could not start a temporary Prefect server ({exc}); set PREFECT_API_URL or run `prefect server start`", code=1)
    run_id = resume or new_run_id(spec.name)
    plan = settle.plan_resume(spec, run_id, blocks, spec_file) if resume else None
    rules = blocks.get("rules")
    if server is not None:
        _watch_server(server, spec, run_id, blocks, spec_file)

    def terminated(signum: int, frame: object) -> None:
        # ours, so that Prefect hands the signal back to us after the flows have crashed, instead
        # of re-raising it with the default action that would end the process on the spot
        raise TerminationSignal(signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        state = training_run(
            spec, run_id=run_id, backend_block=blocks.get("backend"), evidence_block=blocks.get("evidence"),
            retry_policy_block=blocks.get("retry_policy"), rules_file=str(rules) if rules else None,
            resume=plan, return_state=True,
        )
    except (TerminationSignal, KeyboardInterrupt) as exc:
        signum = exc.signal if isinstance(exc, TerminationSignal) else signal.SIGINT
        settle.stopped(spec, run_id, blocks, signum, spec_file)
    except (RuntimeError, OSError) as exc:
        fail(f"could not run on the Prefect API ({exc}); check PREFECT_API_URL or `prefect server start`", code=1)
    finally:  # from here the server may stop with the process: that is no death to report
        settle.stopping.set()
    _print_ending(state, run_id)
    if not state.is_completed():
        raise typer.Exit(1)


def _watch_server(pid: int, spec: TrainingSpec, run_id: str, blocks: dict[str, Any], spec_file: Path | None) -> None:
    """End the run at once if the temporary server dies under it.

    Prefect's client would retry every call for minutes against a server that is gone, deaf to
    everything meanwhile; nothing of the run can reach Prefect any more. A thread watching the
    server's pid stops the attempt through the backend, records it, prints the table and exits.
    """
    from trainguard.cli import settle
    from trainguard.cli.server import server_alive
    from trainguard.core.evidence import verdicts

    def watch() -> None:
        while server_alive(pid):
            time.sleep(0.5)
        if settle.stopping.is_set():  # the run is already ending (its own stop, or the CLI's exit)
            return
        verdicts.last_word()  # the attempt flow, still running in the main thread, keeps none after the stop's
        say(plain(f"the temporary Prefect server (pid {pid}) died; stopping the run here rather than retrying "
                  "a server that is gone", "bold red"))
        try:
            settle.stopped(spec, run_id, blocks, signal.SIGTERM, spec_file,
                           why=f"the temporary Prefect server (pid {pid}) died under trainguard run")
        except typer.Exit as done:
            code = done.exit_code
        except BaseException as exc:  # noqa: BLE001 - the process must end whatever happened
            say(f"error: could not record the stopped attempt: {type(exc).__name__}: {exc}")
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the main thread is stuck in Prefect's retries: nothing else would end the process

    threading.Thread(target=watch, name="temporary-server-watch", daemon=True).start()


def _print_ending(state: Any, run_id: str) -> None:
    """The table of attempts, the final state, how sure the last call is, storage failures and where the evidence is."""
    history = state.result(raise_on_failure=False)
    summaries: list[AttemptSummary] = [AttemptSummary.from_dict(item) for item in history] if isinstance(history, list) else []
    console.print()
    console.print(attempts_table(summaries, title=f"trainguard run {run_id}"))
    say(f"{state.name}: {state.message}")
    if summaries and not summaries[-1].succeeded and (sure := attempt_report.certainty(summaries[-1])):
        culprit = attempt_report.rank_cell(summaries[-1])
        on = f"; culprit rank {culprit}" if culprit not in ("-", "?") else ""
        say(plain(f"attempt {summaries[-1].attempt}: {sure}{on}", "yellow" if summaries[-1].weak else ""))
    for summary in summaries:  # the last word: a full disk is the user's to fix before the next run
        for problem in summary.storage_problems[:_STORAGE_LINES]:
            say(plain(f"storage failed in attempt {summary.attempt}:", "bold red"), " ", problem)
        if len(summary.storage_problems) > _STORAGE_LINES:
            say(f"  and {len(summary.storage_problems) - _STORAGE_LINES} more storage failures: the run's report "
                f"and `trainguard evidence show {run_id}` list them")
    if summaries and summaries[-1].evidence:
        # the location is a path or an s3:// URI: Path() would fold "s3://" into "s3:/"
        run_location = summaries[-1].evidence.rstrip("/").rpartition("/")[0]
        say(f"evidence: {run_location}  (trainguard evidence show {run_id})")


def _submit(spec: TrainingSpec, deployment: str, backend: str | None, evidence: str | None, retry_policy: str | None) -> None:
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectException

    from trainguard.core.attempt import lineage_tags, new_run_id

    run_id = new_run_id(spec.name)
    parameters = {"spec": spec.model_dump(mode="json"), "run_id": run_id, "backend_block": backend,
                  "evidence_block": evidence, "retry_policy_block": retry_policy}
    try:
        flow_run = cast(FlowRun, run_deployment(
            deployment, parameters={k: v for k, v in parameters.items() if v is not None}, timeout=0,
            tags=lineage_tags(run_id, 1, None)))
    except (PrefectException, RuntimeError, OSError, ValueError) as exc:
        fail(f"--deployment {deployment}: could not submit ({exc}); check the name (flow/deployment) and PREFECT_API_URL")
    say(f"submitted run {run_id}: attempt 1 is flow run {flow_run.name} ({flow_run.id})")
