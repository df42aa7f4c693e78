"""The Kubernetes backend: each training attempt is a Job, behind `trainguard.core.backends.base.Backend`.

`run` creates the attempt's Job under a name derived from (run, attempt), so a flow run started
again for the same attempt adopts the Job already there (a 409) instead of starting a second one,
then follows it by watch (`supervise`) and turns what it saw into an `AttemptOutcome`.
`collect_evidence` freezes the cluster's view (`evidence`) and keeps the triage facts and the log
on the flow's machine, where `signals` reads them after the Job is gone. `release` deletes a
succeeded Job and gives a failed one its TTL; `checkpoints` lists the run's checkpoint PVC through a
short-lived pod, which also checks the newest against their acknowledgements (`ListsCheckpoints`). Nothing is deleted before evidence is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard_entrypoint.resumable import VERIFY_SECONDS

from trainguard.core import masking
from trainguard.core.backends.base import (
    COMPLETED, ERROR, LOST, START_ERROR, AttemptOutcome, AttemptRef, CollectedEvidence, Launch, LineSink,
)
from trainguard.core.backends.capabilities import CheckpointListing, NodeEvidence
from trainguard.core.backends.kubernetes import (
    collector, drain, evidence, indexed, kept, kinds, lister, localdir, manifests, placement, zipapp,
)
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.errors import Conflict, KubeError, NotFound
from trainguard.core.backends.kubernetes.podstate import blocking_wait, container_state, job_condition
from trainguard.core.backends.kubernetes.supervise import Ending, Limits, Supervisor
from trainguard.core.backends.kubernetes.supervise_nodes import NodesSupervisor
from trainguard.core.backends.waits import FIRST_SECONDS
from trainguard.core.evidence.manifest import attempt_prefix
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.triage.signals import LogSource, Signals

KIND = "kubernetes"
JOB_DELETED = "JobDeleted"  # someone deleted the Job while it ran: triage reads a cancellation


@dataclass(frozen=True)
class KubeSettings:
    """The backend's settings: the Job's, plus how long to wait and how long to keep failed Jobs."""

    job: manifests.JobSettings
    unschedulable_seconds: float = 600.0
    start_error_seconds: float = 60.0
    failed_job_ttl_seconds: int = 86400
    lister_timeout_seconds: float = 60.0  # the checkpoint lister pod's start and listing, beside its hashing
    # how long the lister may hash the newest checkpoints' files against their acknowledgements (sizes
    # are always checked): about 120 GB at 1 GB/s, 18 GB from a network volume at 150 MB/s
    checkpoint_verify_seconds: float = VERIFY_SECONDS
    local_root: str | None = None  # where triage facts and logs are kept on the flow's machine
    # what the collector pod copies of the attempt's folder, by apparent size (a sparse file counts whole)
    evidence_copy_budget_bytes: int = collector.DEFAULT_BUDGET_BYTES
    # several nodes: how long the other pods may take to fail on their own after the first failed
    survivor_grace_seconds: float = 30.0
    # a pod not running yet is reported after this long, then at growing intervals (`waits.WaitNotice`)
    report_first_seconds: float = FIRST_SECONDS


class KubernetesBackend:
    """Runs attempts as Kubernetes Jobs. The client is built lazily from `connect`, never pickled."""

    kind = KIND
    evidence_first = True  # deleting the Job deletes its pods and their logs: collect first

    def __init__(self, connect: Callable[[], KubeApi], settings: KubeSettings) -> None:
        self.connect, self.settings = connect, settings
        self._api: KubeApi | None = None
        self._listings: dict[str, CheckpointListing] = {}  # the last listing of each run's checkpoints
        self._config_map: str | None = None  # the entrypoint ConfigMap, once this instance made or found it
        # what collection kept of the last attempt judged, read once for its signals, nodes and log
        self._kept_read: tuple[tuple[str, int], kept.KeptAttempt] | None = None

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = self.connect()
        return self._api

    @property
    def namespace(self) -> str:
        return self.settings.job.namespace

    def kept_dir(self, run_id: str, attempt: int) -> Path:
        """Where this machine keeps the attempt's triage facts and log, made private (`localdir`).

        Raises:
            localdir.UnsafeFolder: The root may not be used; the message says why and how to fix it.
        """
        root = localdir.private_root(self.settings.local_root)
        kept_dir = root / attempt_prefix(run_id, attempt)
        localdir.make_dirs(kept_dir, root)
        return kept_dir

    def provision(self, run_id: str, attempt: int) -> AttemptRef:
        """Make sure the entrypoint ConfigMap exists; the Job itself is created by `run`."""
        config_map = self._entrypoint_config_map()
        return AttemptRef(KIND, run_id, attempt, name=manifests.job_name(run_id, attempt),
                          workspace=manifests.workspace_path(run_id, attempt),
                          checkpoint_dir=manifests.checkpoint_path(run_id),
                          details={"namespace": self.namespace, "config_map": config_map})

    def run(self, ref: AttemptRef, launch: Launch, on_line: LineSink | None = None) -> AttemptOutcome:
        """Create (or adopt) the attempt's Job (and Service, on several nodes) and follow it until it is terminal.

        Where one pod per node is required and the scheduler says the cluster cannot give each pod
        its own node, the Job is made again with the anti-affinity preferred (`placement`), once.
        The nodes to avoid are kept to those it can be kept off (`_avoiding`).
        """
        launch = self._avoiding(launch, on_line)
        started = self._start(ref, launch, on_line)
        if isinstance(started, AttemptOutcome):
            return started
        relaxable = launch.nodes > 1 and self.settings.job.one_pod_per_node
        ending = self._supervisor(launch, on_line, started, relaxable).run()
        if ending.why != placement.SPREAD:
            return outcome_of_ending(ending)
        note = placement.relaxed_note(launch.nodes, ending.message)
        _say(on_line, note)
        try:
            placement.delete_and_wait(self.api, self.kind_of_job, self.namespace, ref.name,
                                      manifests.selector(ref.run_id, ref.attempt))
        except (KubeError, TimeoutError) as exc:
            return AttemptOutcome(None, None, START_ERROR, f"{note}; but the Job could not be made again: {exc}")
        started = self._start(ref, launch, on_line, indexed.PREFERRED)
        if isinstance(started, AttemptOutcome):
            return replace(started, placement=note)
        return replace(outcome_of_ending(self._supervisor(launch, on_line, started, False).run()), placement=note)

    def _avoiding(self, launch: Launch, on_line: LineSink | None) -> Launch:
        """The launch kept off only what names a schedulable Node, and only while enough are left.

        A name that cannot be a Node's names none (the API refuses it in an affinity); one the
        cluster does not list is left out; avoiding every node would leave the pods unschedulable for
        good, so then nothing is avoided and the attempt says so. Where the account may not list the
        nodes, the names are applied as they are.
        """
        if not launch.avoid_nodes:
            return launch
        wanted = tuple(dict.fromkeys(node for node in launch.avoid_nodes if manifests.node_name(node)))
        try:
            listed = set(self.placeable_nodes())
        except KubeError:
            return replace(launch, avoid_nodes=wanted)
        avoid = tuple(node for node in wanted if node in listed)
        left = len(listed - set(avoid))
        # Only no node at all is sure to leave the pods unschedulable: fewer nodes than pods can still
        # take them where one pod per node relaxes to preferred, or a node has room for several.
        if avoid and left == 0:
            _say(on_line, f"not keeping the attempt off {', '.join(avoid)}: that would leave {left} of the "
                          f"{len(listed)} schedulable nodes, and it needs {launch.nodes}")
            return replace(launch, avoid_nodes=())
        return replace(launch, avoid_nodes=avoid)

    def _start(self, ref: AttemptRef, launch: Launch, on_line: LineSink | None,
               spread: str | None = None) -> dict[str, Any] | None | AttemptOutcome:
        """Create the attempt's Job (None: adopted one already there) and what it owns; an outcome if it cannot start."""
        config_map = ref.details.get("config_map") or zipapp.config_map_name()
        try:
            body = kinds.manifest(self.settings.job, launch, config_map, spread)
        except ValueError as exc:
            return AttemptOutcome(None, None, START_ERROR, str(exc))
        created: dict[str, Any] | None = None
        try:
            created = kinds.create(self.api, self.namespace, body)
        except Conflict:
            pass  # this attempt's Job is already there: follow it (from a fresh list), never start a second
        except KubeError as exc:
            return AttemptOutcome(None, None, START_ERROR, f"could not create the Job: {exc}")
        if created is None:
            _say(on_line, f"adopting the running Job {self.namespace}/{ref.name}")
        try:
            self._complete_job(ref, launch, created)
        except ForeignSecret as exc:
            return AttemptOutcome(None, None, START_ERROR, str(exc))
        except KubeError as exc:
            return AttemptOutcome(None, None, START_ERROR, f"could not give the Job its Service or secret_env: {exc}")
        return created

    def _supervisor(self, launch: Launch, on_line: LineSink | None, created: dict[str, Any] | None,
                    relaxable: bool = False) -> Supervisor:
        limits = Limits(unschedulable_seconds=self.settings.unschedulable_seconds,
                        start_error_seconds=self.settings.start_error_seconds,
                        report_first_seconds=self.settings.report_first_seconds,
                        stall_seconds=launch.stall_seconds, deadline_seconds=launch.deadline_seconds)
        kind = self.kind_of_job
        args = (self.api, self.namespace, launch.run_id, launch.attempt, limits)
        watched: dict[str, Any] = {"on_line": on_line, "created": created, "job_resource": kinds.resource(kind)}
        if launch.nodes > 1:
            # a PyTorchJob is Failed from its first failed replica on, with the survivors still running
            done = ("Complete", "Failed") if kind == kinds.JOB else (kinds.succeeded(kind),)
            return NodesSupervisor(*args, **watched, done=done, nodes=launch.nodes, relaxable=relaxable,
                                   grace_seconds=self.settings.survivor_grace_seconds, index_of=kinds.index_of(kind),
                                   hold=self.settings.job.hold_mode or kind == kinds.PYTORCHJOB)
        return Supervisor(*args, **watched, done=(kinds.succeeded(kind), "Failed"))

    @property
    def kind_of_job(self) -> str:
        """What each attempt is: a Job (an Indexed Job on several nodes), or a PyTorchJob."""
        return kinds.PYTORCHJOB if self.settings.job.job_kind == kinds.PYTORCHJOB else kinds.JOB

    def _complete_job(self, ref: AttemptRef, launch: Launch, created: dict[str, Any] | None) -> None:
        """Create what the Job needs before its pods start, owned by it, then let the suspended Job start:
        the headless Service its pods find each other through (several nodes), and its Secret.

        Every step is idempotent, so a flow run started again after dying between them (a Job that
        waits suspended, with or without its Service and Secret) finishes them: a 409 on an adopted
        Job means the earlier run created it under this Job. Both go with the Job (garbage
        collection). A Secret already there when the Job was just created is no earlier run's: this
        account may not read it to check whose it is, so the Job is not resumed (`ForeignSecret`):
        its pods would read values someone else chose.
        """
        job = created if created is not None else kinds.read(self.api, self.kind_of_job, self.namespace, ref.name)
        owned: list[tuple[Callable[[str, dict[str, Any]], Any], dict[str, Any]]] = []
        if launch.nodes > 1 and self.kind_of_job == kinds.JOB:  # the operator makes a PyTorchJob's
            owned.append((self.api.create_service, indexed.service_manifest(job)))
        secret = manifests.secret_manifest(self.settings.job, launch, job)
        if secret is not None:
            owned.append((self.api.create_secret, secret))
        for create, body in owned:
            try:
                create(self.namespace, body)
            except Conflict:
                if created is not None and body is secret:
                    name = body["metadata"]["name"]
                    raise ForeignSecret(
                        f"the Secret {self.namespace}/{name} was there before this attempt's Job, so it is not its "
                        f"own (this account may not read Secrets to check whose it is); the Job was not started: "
                        f"delete it (kubectl delete secret {name} -n {self.namespace}) and run again") from None
        if kinds.suspended(job):
            kinds.resume(self.api, self.kind_of_job, self.namespace, ref.name)

    def collect_evidence(
        self, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None,
        extra: Mapping[str, bytes] | None = None,
    ) -> CollectedEvidence:
        extra = dict(extra or {})
        self._kept_read = None  # what is kept is about to be written again
        if outcome is not None:
            shown = masking.mask_tree(outcome.to_dict())
            extra.setdefault("kubernetes/outcome.json", json.dumps(shown, indent=2).encode())
        kept_dir, problem = None, None
        try:
            kept_dir = self.kept_dir(ref.run_id, ref.attempt)
        except OSError as exc:  # the store still gets everything; triage reads what the supervisor saw
            problem = f"not kept on this machine: {exc}"
        manifest = evidence.collect_kubernetes_evidence(
            self.api, self.namespace, ref.name, ref.run_id, ref.attempt, store, extra=extra,
            kept_dir=kept_dir, pod=outcome.instance if outcome else None, local_problem=problem,
            copy_budget_bytes=self.settings.evidence_copy_budget_bytes, kind=self.kind_of_job)
        return CollectedEvidence(manifest, store.describe(attempt_prefix(ref.run_id, ref.attempt)))

    def signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> Signals:
        """The outcome joined with what collection kept of the pod it ended on (`kept.KeptAttempt.signals`)."""
        return self._kept(ref).signals(outcome)

    def log(self, ref: AttemptRef, outcome: AttemptOutcome) -> LogSource:
        return self._kept(ref).log(outcome)

    def node_signals(self, ref: AttemptRef, outcome: AttemptOutcome) -> list[NodeEvidence]:
        """Each pod's signals, by node rank, for an attempt of several pods; [] for one (`kept.KeptAttempt.nodes`)."""
        return self._kept(ref).nodes(outcome)

    def _kept(self, ref: AttemptRef) -> kept.KeptAttempt:
        """What collection kept on this machine (`nodes.keep_nodes`, the triage facts); nothing when the folder
        may not be trusted: what the supervisor saw still classifies, the attempt judged as one.

        Read once per attempt after its collection: judging its nodes, then the attempt as one when no
        pod failed, then its log for the progress chart, all read the same facts.
        """
        key = (ref.run_id, ref.attempt)
        if self._kept_read is None or self._kept_read[0] != key:
            try:
                kept_dir: Path | None = self.kept_dir(ref.run_id, ref.attempt)
            except OSError:
                kept_dir = None
            self._kept_read = (key, kept.read(kept_dir, ref.run_id, ref.attempt))
        return self._kept_read[1]

    def placeable_nodes(self) -> list[str]:
        """Nodes the Job's pods could land on: those matching the block's node selector, not cordoned."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.settings.job.node_selector.items()))
        listed = self.api.list_nodes(selector or None).get("items") or []
        return sorted(str(n["metadata"]["name"]) for n in listed if not (n.get("spec") or {}).get("unschedulable"))

    def checkpoints(self, run_id: str) -> list[str]:
        """The run's checkpoints, newest first, as paths inside the containers (the same in every attempt).

        A lister pod reads the checkpoint volume (`lister`): the newest checkpoints whose files do not
        match their acknowledgement are left out (said, with why), as on the other backends, and what
        it read is kept for `checkpoint_listing`. A listing that fails gives no checkpoint, and says why.
        """
        folder = manifests.checkpoint_path(run_id)
        self._listings.pop(run_id, None)
        try:
            listing = lister.run(self.api, self.settings.job, run_id, folder, self.settings.lister_timeout_seconds,
                                 config_map=self._entrypoint_config_map(),
                                 verify_seconds=self.settings.checkpoint_verify_seconds)
        except (KubeError, ValueError, TimeoutError) as exc:
            _say(None, f"could not list the checkpoints of run {run_id} (claim {self.settings.job.checkpoint_claim}): "
                       f"{exc}")
            return []
        self._listings[run_id] = listing
        for name, why in listing.left_out:
            _say(None, f"not resuming from {folder}/{name}: its files do not match its acknowledgement: {why}")
        for name, why in listing.unchecked:
            _say(None, f"{folder}/{name}: {why}")
        for note in listing.notes:
            _say(None, f"listing the checkpoints of run {run_id}: {note}")
        return [f"{folder}/{name}" for name in listing.checkpoints]

    def checkpoint_listing(self, run_id: str) -> CheckpointListing | None:
        """What the last `checkpoints(run_id)` of this instance read on the volume (acknowledgements, progress)."""
        return self._listings.get(run_id)

    def _entrypoint_config_map(self) -> str:
        """The entrypoint ConfigMap's name, made if it is not there yet (named by its digest, so one there holds
        the same bytes): the Job and the checkpoint lister run from it. Asked for once per instance (an
        attempt's provisioning, then its listing): not again before each listing."""
        if self._config_map is None:
            body = zipapp.config_map(self.namespace)
            try:
                self.api.create_config_map(self.namespace, body)
            except Conflict:
                pass
            self._config_map = str(body["metadata"]["name"])
        return self._config_map

    def release(self, ref: AttemptRef) -> str | None:
        """Delete a succeeded Job now; keep a failed one for `failed_job_ttl_seconds` (its TTL); then wait
        for its pods still stopping (`drain`): a warning line when they outlast their grace, else None.

        A Job that has not finished (unschedulable, stalled, stopped, its pod disrupted, survivors
        still running after the first pod failed) is deleted: a TTL would never start, and it must not
        train on beside the next attempt. The headless Service of a multi-node attempt goes once its
        pods ended: only they needed it.
        """
        try:
            job = kinds.read(self.api, self.kind_of_job, self.namespace, ref.name)
            failed = job_condition(job, "Failed")
            if not failed or self.settings.failed_job_ttl_seconds <= 0:
                kinds.delete(self.api, self.kind_of_job, self.namespace, ref.name)
            else:
                kinds.patch_ttl(self.api, self.kind_of_job, self.namespace, ref.name,
                                self.settings.failed_job_ttl_seconds)
        except NotFound:
            job = {}  # already gone (deleted by someone, or its TTL ran out); the Service with it
        problem = drain.wait_ended(self.api, self.namespace, manifests.selector(ref.run_id, ref.attempt))
        if (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("subdomain") == ref.name:
            try:
                self.api.delete_service(self.namespace, ref.name)
            except NotFound:
                pass
        return problem

    def lost_outcome(self, ref: AttemptRef) -> AttemptOutcome:
        """From the cluster: the attempt's Job and its pod (the first that failed, else the newest), read as
        the supervisor reads them when it stops; `LOST` when the cluster no longer has them or cannot say."""
        try:
            try:
                job: dict[str, Any] | None = kinds.read(self.api, self.kind_of_job, self.namespace, ref.name)
            except NotFound:
                job = None
            pods = self.api.list_pods(self.namespace, label_selector=manifests.selector(ref.run_id, ref.attempt))
        except KubeError as exc:
            return AttemptOutcome(None, None, LOST, f"its supervisor was lost, and the cluster could not say how it "
                                                    f"ended: {exc}")
        items = sorted(pods.get("items") or [], key=lambda p: str(p.get("metadata", {}).get("creationTimestamp")))
        failed = [p for p in items if p.get("status", {}).get("phase") == "Failed"]
        pod = failed[0] if failed else (items[-1] if items else None)
        if job is None and pod is None:
            return AttemptOutcome(None, None, LOST, f"its supervisor was lost, and its {self.kind_of_job} "
                                                    f"{self.namespace}/{ref.name} is gone")
        return outcome_of_ending(Ending(job, pod, job_deleted=job is None))

    def stop_orphan(self, ref: AttemptRef) -> str | None:
        """Stop the Job of an attempt whose flow process died, once its evidence is kept.

        A Job still running is deleted (its pods with it): the next attempt gets a Job of its own
        name, and two Jobs must never train on one checkpoint folder. A finished one is released as
        the flow would have (a failed Job keeps its TTL), so it is not left behind for good.
        """
        try:
            job = kinds.read(self.api, self.kind_of_job, self.namespace, ref.name)
        except NotFound:
            return None
        if job_condition(job, kinds.succeeded(self.kind_of_job), "Failed"):
            self.release(ref)
            return None
        try:
            kinds.delete(self.api, self.kind_of_job, self.namespace, ref.name)
        except NotFound:
            return None
        return f"deleted the {self.kind_of_job} {self.namespace}/{ref.name}, still running without its flow run"

class ForeignSecret(Exception):
    """The attempt's Secret was made by someone else; the message says so and what to do."""


def _say(on_line: LineSink | None, message: str) -> None:
    if on_line is not None:
        on_line(f"trainguard: {message}")
    else:
        print(f"trainguard: {message}", flush=True)


def outcome_of_ending(ending: Ending) -> AttemptOutcome:
    """The seam's outcome from where the supervisor stopped."""
    pod, job = ending.pod or {}, ending.job or {}
    terminated = container_state(pod).get("terminated") or {}
    exit_code = terminated.get("exitCode")
    signal = terminated.get("signal") or (exit_code - 128 if isinstance(exit_code, int) and exit_code > 128 else None)
    reason, message = _reason(ending, pod, job, terminated)
    conditions = tuple((pod.get("status", {}).get("conditions") or []) + (job.get("status", {}).get("conditions") or []))
    return AttemptOutcome(
        exit_code=exit_code, signal=signal, reason=reason, message=masking.current().mask(message),
        started_at=terminated.get("startedAt") or pod.get("status", {}).get("startTime"),
        finished_at=terminated.get("finishedAt"), duration_seconds=_duration(pod, terminated),
        node=pod.get("spec", {}).get("nodeName"), conditions=conditions, log_tail="\n".join(ending.log_tail),
        instance=pod.get("metadata", {}).get("name"),
    )


def _reason(ending: Ending, pod: Mapping[str, Any], job: Mapping[str, Any],
            terminated: Mapping[str, Any]) -> tuple[str, str]:
    """The most telling reason and its message, in the order triage trusts them."""
    waiting = blocking_wait(pod)
    fixed = {"unschedulable": kept.UNSCHEDULABLE, "start_error": waiting.get("reason") or START_ERROR,
             "stalled": "Stalled", "deadline": "DeadlineExceeded", "api": ERROR}
    if ending.why in fixed:
        scheduled: Mapping[str, Any] = next((c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        detail = {"unschedulable": scheduled.get("message"), "start_error": waiting.get("message"),
                  "stalled": "no new log output within stall_seconds",
                  "deadline": "the Job outlived its deadline", "api": ending.message}
        return fixed[ending.why], str(detail.get(ending.why) or ending.message or ending.why)
    failed = job_condition(job, "Failed", "FailureTarget") or {}
    if pod.get("status", {}).get("reason"):
        return str(pod["status"]["reason"]), str(pod["status"].get("message") or "")
    if failed.get("reason") == "DeadlineExceeded" or terminated.get("reason") == "OOMKilled":
        chosen = failed if failed.get("reason") == "DeadlineExceeded" else terminated
        return str(chosen["reason"]), str(chosen.get("message") or "")[:500]
    if terminated.get("exitCode") == 0 and not failed:
        return COMPLETED, "training completed"
    if ending.job_deleted and terminated.get("exitCode") in (None, 137, 143):
        # killed by the deletion (SIGTERM, then SIGKILL), or never seen ending: someone stopped it
        return JOB_DELETED, "the Job was deleted while the attempt ran"
    if ending.job_deleted:
        return str(terminated.get("reason") or ERROR), "the Job was deleted after the command ended"
    text = failed.get("message") or f"exit code {terminated.get('exitCode')}"
    return (ERROR if terminated else str(failed.get("reason") or ERROR)), str(text)


def _duration(pod: Mapping[str, Any], terminated: Mapping[str, Any]) -> float:
    """How long the training container ran: until it ended, or until now when the supervisor stopped it
    while it still ran (stalled, past its deadline): those seconds held the GPUs all the same."""
    running = container_state(pod).get("running") or {}
    started = terminated.get("startedAt") or running.get("startedAt") or pod.get("status", {}).get("startTime")
    try:
        start = datetime.fromisoformat(str(started).replace("Z", "+00:00"))
        end = (datetime.fromisoformat(str(terminated["finishedAt"]).replace("Z", "+00:00"))
               if terminated.get("finishedAt") else datetime.now(UTC))
    except ValueError:
        return 0.0
    return max(0.0, (end - start).total_seconds())
