"""What one training attempt amounted to, in a form every driver, report and hook can share.

`AttemptSummary` is the value an attempt flow returns (or carries in its Failed state's data), the
row of the attempts table, and the source of the policy's `AttemptRecord`. `next_parameters` builds
the next attempt's flow parameters, so the state hook and the notebook driver chain attempts the
same way. No Prefect here: the flows wrap these values in states.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from trainguard.core import masking
from trainguard.core.policy import AttemptRecord, RetryDecision
from trainguard.core.taxonomy import Category
from trainguard.core.triage.hangs import HangVerdict
from trainguard.core.triage.parts import Verdict
from trainguard.core.triage.signals import Diagnosis

LINEAGE_TAG = "trainguard-run"


@dataclass(frozen=True)
class Judgement:
    """Triage's verdict on one attempt: its diagnosis, and on several nodes the culprit across them.

    Attributes:
        diagnosis: The verdict (None: the attempt succeeded).
        across: The root cause across the attempt's nodes and the victims passed over, for an
            attempt of two or more nodes.
        nodes: node index -> (pod or task name, machine), to say where the culprit and victims were.
    """

    diagnosis: Diagnosis | None
    across: Verdict | None = None
    nodes: Mapping[int, tuple[str | None, str | None]] = field(default_factory=dict)
    hang: HangVerdict | None = None  # what the ranks' stacks, taken while they were alive, say


@dataclass(frozen=True)
class UploadStatus:
    """Where an attempt's evidence stands beyond its counts (`evidence.bundles.upload_status`).

    Attributes:
        spooled: Item names still waiting in the local spool for the object store.
        upload_error: Why they wait.
        uploading: They go up in the background after the verdict (`evidence.afterupload`).
        links: Item name -> (presigned) URL, for the report that shows it now; never stored.
        links_expire_at: When presigned links expire, ISO-8601 ("" for links that do not).
    """

    spooled: tuple[str, ...] = ()
    upload_error: str = ""
    uploading: bool = False
    links: Mapping[str, str] = field(default_factory=dict)
    links_expire_at: str = ""


@dataclass(frozen=True)
class AttemptSummary:
    """One attempt of a run: what happened, why, what it cost and what comes next."""

    run_id: str
    attempt: int
    max_attempts: int  # the policy's max_attempts: attempts in a row without checkpoint progress
    state: str  # "Completed", "Failed" or "Crashed"
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    category: str | None = None
    retryable: bool = False
    rule_id: str | None = None
    signature: str | None = None
    line_number: int | None = None
    remediation: str | None = None
    fingerprint: str = ""
    exit_code: int | None = None
    termination_reason: str | None = None
    duration_seconds: float = 0.0
    gpus: int = 0
    resumed_from: str | None = None
    newest_checkpoint: str | None = None
    evidence: str | None = None
    evidence_items: int = 0
    evidence_missing: int = 0
    evidence_spooled: Sequence[str] = ()  # items still waiting in the local spool for the object store
    evidence_upload_error: str = ""  # why they wait
    evidence_uploading: bool = False  # they go up to the object store after the verdict, in the background
    evidence_links: Mapping[str, str] = field(default_factory=dict)  # item name -> (presigned) URL; never stored
    evidence_links_expire_at: str = ""
    storage_problems: Sequence[str] = ()  # what trainguard could not write (log, reports, evidence), and why
    node: str | None = None
    memory_factor: float = 1.0  # the attempt's memory request and limit scale (host_oom policy)
    avoided_nodes: Sequence[str] = ()  # the run's avoid list this attempt was placed with (culprits' nodes)
    placement: str | None = None  # what the backend had to change about where the attempt ran
    progress: Sequence[tuple[int, float | None]] = ()  # (step, loss) points from the log, thinned
    decision: RetryDecision | None = None  # the retry policy's, once decided
    # how sure the call is: triage's strength of the deciding evidence, what broke a tie, and whether
    # a person should check it by hand (a fallback rule, a tie broken by rule order)
    strength: str = ""
    decided_by: str = ""
    weak: bool = False
    # the culprit among the ranks (and, on several nodes, the pods): {index, pod, node, rank,
    # first_error_at, rule_id, margin_seconds}; the ranks passed over as its victims; and whether only
    # victims were found (a hang or desync whose origin the evidence does not show)
    root_cause: Mapping[str, Any] | None = None
    victims: Sequence[Mapping[str, Any]] = ()
    culprit_undetermined: bool = False
    # every rank's stack as the report's table shows it, when they were taken before the attempt ended:
    # {kind, culprits, frame, reason, rows: [{rank, node, state, top, differs}], ranks, states, left_out};
    # at most `STACK_ROWS` rows (the culprits' kept first), its text cut: it travels in the next attempt's
    # parameters. The whole table is the evidence's `STACKS_TABLE`.
    stacks: Mapping[str, Any] | None = None
    # the shared avoid list's entries in force at launch ({node, reason, expires_at, added_by}), and why
    # they were not applied when they were not (they would have left too few nodes)
    avoid_list: Sequence[Mapping[str, Any]] = ()
    avoid_note: str = ""
    # what its checkpoints say (`trainguard.core.checkpoints`): the kind ("periodic", "notice",
    # "just_in_time", "unknown") and step of the one it resumed from and of the newest it left, the
    # last optimizer step it completed, the steps lost (that step minus the step the next attempt
    # resumes from) and the seconds from the notice to the newest checkpoint's acknowledgement
    resumed_from_kind: str | None = None
    resumed_from_step: int | None = None
    newest_checkpoint_kind: str | None = None
    newest_checkpoint_step: int | None = None
    progress_step: int | None = None
    steps_lost: int | None = None
    notice_to_ack_seconds: float | None = None

    @property
    def gpu_seconds(self) -> float:
        """GPUs held times wall time: what the attempt cost."""
        return self.gpus * self.duration_seconds

    @property
    def steps(self) -> tuple[int, int] | None:
        """The steps it made past the checkpoint it resumed from, and how many of them are lost (redone by the
        next attempt); None when its checkpoint facts do not say. A succeeded attempt loses none."""
        if self.progress_step is None:
            return None
        made = self.progress_step - (self.resumed_from_step or 0)
        lost = 0 if self.succeeded else self.steps_lost
        if lost is None:
            return None if made > 0 else (made, 0)
        return made, max(0, min(made, lost))

    @property
    def wasted_gpu_seconds(self) -> float:
        """GPU-seconds of a failed attempt that no checkpoint kept: the share of its steps it lost, all of it
        when it made none or its steps are not known. The run report and the fleet view both count this."""
        if self.succeeded:
            return 0.0
        steps = self.steps
        if steps is None or steps[0] <= 0:
            return self.gpu_seconds
        made, lost = steps
        return self.gpu_seconds * lost / made

    @property
    def succeeded(self) -> bool:
        return self.state == "Completed"

    @property
    def retried(self) -> bool:
        """Whether its retry decision was to run another attempt (False before it is decided)."""
        return self.decision is not None and self.decision.retry

    def record(self) -> AttemptRecord:
        """The policy's view of this attempt."""
        return AttemptRecord(
            attempt=self.attempt,
            category=Category(self.category) if self.category else None,
            retryable=self.retryable,
            fingerprint=self.fingerprint,
            resumed_from=self.resumed_from,
            newest_checkpoint=self.newest_checkpoint,
            node=self.node,
            memory_factor=self.memory_factor,
        )

    def with_decision(self, decision: RetryDecision) -> AttemptSummary:
        return _replace(self, decision=decision)

    def with_judgement(self, judgement: Judgement) -> AttemptSummary:
        """This summary with triage's verdict: one node's, or the culprit across nodes (`Judgement`)."""
        judged = self.with_diagnosis(judgement.diagnosis)
        if judgement.hang is not None:
            judged = _replace(judged, stacks=_stacks_table(judgement.hang))
        if judgement.across is None:
            return judged
        root, where = judgement.across.root_cause, judgement.nodes

        def place(index: int | None) -> tuple[str | None, str | None]:
            return where.get(index, (None, None)) if index is not None else (None, None)

        pod, node = place(root.index)
        root_cause = None if root.index is None else {
            "index": root.index, "pod": pod, "node": node, "rank": root.rank, "rule_id": root.rule_id,
            "first_error_at": _iso(root.first_error_at), "margin_seconds": root.margin_seconds}
        victims = tuple({"index": v.index, "pod": place(v.index)[0], "rank": v.rank,
                         "reason": masking.for_people(v.reason), "rule_id": v.rule_id} for v in judgement.across.victims)
        return _replace(judged, root_cause=root_cause, victims=victims, culprit_undetermined=root.index is None,
                        node=node or judged.node)

    def with_diagnosis(self, diagnosis: Diagnosis | None) -> AttemptSummary:
        """This summary with triage's verdict; its signature is a log line, so it is masked for people here."""
        if diagnosis is None:
            return self
        root_cause = None if diagnosis.culprit_undetermined else {
            "index": 0, "pod": None, "node": self.node, "rank": diagnosis.rank, "rule_id": diagnosis.rule_id,
            "first_error_at": _iso(diagnosis.failed_at), "margin_seconds": None}
        return _replace(
            self, category=diagnosis.category.value, retryable=diagnosis.retryable, rule_id=diagnosis.rule_id,
            signature=masking.for_people(diagnosis.signature) if diagnosis.signature else None,
            line_number=diagnosis.line_number, remediation=diagnosis.remediation, fingerprint=diagnosis.fingerprint,
            strength=diagnosis.strength, decided_by=diagnosis.decided_by, weak=diagnosis.weak,
            root_cause=root_cause, culprit_undetermined=diagnosis.culprit_undetermined,
            victims=tuple({"index": 0, "pod": None, "rank": v.rank, "reason": masking.for_people(v.reason),
                           "rule_id": v.rule_id} for v in diagnosis.victims),
        )

    def with_evidence(self, location: str | None, items: int, missing: int, *, problems: Sequence[str] = (),
                      unreserved: str | None = None) -> AttemptSummary:
        """This summary with what evidence collection kept (None ``location``: nothing was collected).

        Args:
            location, items, missing: Where the bundle is, the items kept and those that could have been there.
            problems: What the store failed to take, one line each.
            unreserved: Why space could not be set aside for the manifest and verdict beforehand; it
                matters only when the store then failed to take something.
        """
        kept = _replace(self, evidence=location, evidence_items=items, evidence_missing=missing)
        return kept.with_storage_problems(*problems, unreserved if problems and unreserved else None)

    def with_progress(self, points: Sequence[tuple[int, float | None]], newest_checkpoint: str | None) -> AttemptSummary:
        """This summary with its (step, loss) points from the log and the run's newest checkpoint after it."""
        return _replace(self, progress=tuple(points), newest_checkpoint=newest_checkpoint)

    def with_upload(self, status: UploadStatus) -> AttemptSummary:
        """This summary with a newer upload status."""
        return _replace(self, evidence_spooled=tuple(status.spooled), evidence_upload_error=status.upload_error,
                        evidence_uploading=status.uploading, evidence_links=dict(status.links),
                        evidence_links_expire_at=status.links_expire_at)

    def with_storage_problems(self, *problems: str | None) -> AttemptSummary:
        """This summary with more storage failures (None entries are skipped)."""
        return _replace(self, storage_problems=(*self.storage_problems, *(p for p in problems if p)))

    def to_dict(self) -> dict[str, Any]:
        """The summary as stored (verdict.json, flow results, events, the next attempt's history).

        Without the evidence links: a presigned URL expires, and under temporary credentials (STS,
        IRSA) it carries the session token; only the report that shows it now may hold it.
        """
        data = asdict(self)
        del data["evidence_links"], data["evidence_links_expire_at"]
        data["decision"] = self.decision.to_dict() if self.decision is not None else {}
        data["progress"] = [list(point) for point in self.progress]
        data["storage_problems"] = list(self.storage_problems)
        data["avoided_nodes"] = list(self.avoided_nodes)
        data["root_cause"] = dict(self.root_cause) if self.root_cause is not None else None
        data["victims"] = [dict(v) for v in self.victims]
        data["avoid_list"] = [dict(entry) for entry in self.avoid_list]
        data["gpu_seconds"] = self.gpu_seconds
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptSummary:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["progress"] = _progress(values.get("progress"))
        decision = values.get("decision")
        values["decision"] = RetryDecision.from_dict(decision) if isinstance(decision, Mapping) and decision else None
        avoided = values.get("avoided_nodes")
        values["avoided_nodes"] = tuple(str(n) for n in avoided) if isinstance(avoided, list | tuple) else ()
        problems = values.get("storage_problems")
        values["storage_problems"] = tuple(str(p) for p in problems) if isinstance(problems, list | tuple) else ()
        root = values.get("root_cause")
        values["root_cause"] = dict(root) if isinstance(root, Mapping) else None
        victims = values.get("victims")
        values["victims"] = tuple(dict(v) for v in victims if isinstance(v, Mapping)) \
            if isinstance(victims, list | tuple) else ()
        avoided = values.get("avoid_list")
        values["avoid_list"] = tuple(dict(e) for e in avoided if isinstance(e, Mapping)) \
            if isinstance(avoided, list | tuple) else ()
        return cls(**values)


STACKS_TABLE = "stacks-table.json"
STACK_ROWS = 32  # of the table a summary carries
_CUT = {"node": 64, "top": 100, "differs": 160, "frame": 300, "reason": 400, "culprits": 64}


def stacks_table(verdict: HangVerdict, rows: int | None = None) -> dict[str, Any]:
    """The stacks' verdict as plain data (frames are masked for people): every rank's row, or with
    ``rows`` at most that many, the culprits first, each text cut (`_CUT`), saying what was left out."""
    def cut(text: str, kind: str) -> str:
        return text[:_CUT[kind]] if rows is not None else text

    chosen = list(verdict.rows)
    if rows is not None:  # the culprits' rows first, then the others', shown in the table's order
        odd = set(verdict.culprits)
        kept = set(sorted(range(len(chosen)), key=lambda i: chosen[i].rank not in odd)[:rows])
        chosen = [row for i, row in enumerate(chosen) if i in kept]
    table_rows = [{"rank": r.rank, "node": cut(r.node, "node") if r.node is not None else None, "state": r.state,
                   "top": [cut(masking.for_people(f), "top") for f in r.top],
                   "differs": cut(masking.for_people(r.differs), "differs")} for r in chosen]
    culprits = list(verdict.culprits)[:_CUT["culprits"]] if rows is not None else list(verdict.culprits)
    return {"kind": verdict.kind, "culprits": culprits, "frame": cut(masking.for_people(verdict.frame), "frame"),
            "reason": cut(masking.for_people(verdict.reason), "reason"), "rows": table_rows,
            "ranks": len(verdict.rows), "states": dict(Counter(r.state for r in verdict.rows)),
            "left_out": len(verdict.rows) - len(table_rows)}


def _stacks_table(verdict: HangVerdict) -> dict[str, Any]:
    return stacks_table(verdict, STACK_ROWS)


def _iso(stamp: float | None) -> str | None:
    """Seconds since the epoch as ISO-8601 UTC (None stays None)."""
    return datetime.fromtimestamp(stamp, UTC).isoformat() if stamp is not None else None


def _progress(points: Any) -> tuple[tuple[int, float | None], ...]:
    """Progress points read back from JSON; anything malformed is dropped, never raised."""
    kept = []
    for point in points if isinstance(points, list | tuple) else ():
        try:
            step, loss = int(point[0]), None if point[1] is None else float(point[1])
        except (TypeError, ValueError, IndexError):
            continue
        kept.append((step, loss))
    return tuple(kept)


def _replace(summary: AttemptSummary, **changes: Any) -> AttemptSummary:
    return replace(summary, **changes)


class AttemptFailed(Exception):
    """The data of a failed attempt's state: the summary, picklable (every argument goes to super)."""

    def __init__(self, message: str, summary: AttemptSummary) -> None:
        super().__init__(message, summary)
        self.summary = summary

    def __str__(self) -> str:
        return str(self.args[0])


def new_run_id(name: str, seed: uuid.UUID | str | None = None) -> str:
    """A run id: the spec name plus 8 hex digits, derived from `seed` (a flow run id) when given."""
    token = uuid.UUID(str(seed)).hex[:8] if seed is not None else uuid.uuid4().hex[:8]
    return f"{name}-{token}"


def next_parameters(
    parameters: Mapping[str, Any], summary: AttemptSummary, decision: RetryDecision, flow_run_id: str
) -> dict[str, Any]:
    """The next attempt's flow parameters: same spec and blocks, lineage moved one step on."""
    history = [*(parameters.get("history") or []), summary.to_dict()]
    scaled = {"memory_factor": decision.memory_factor} if decision.memory_factor != 1.0 else {}
    return {
        **{k: v for k, v in parameters.items() if k != "memory_factor"},
        **scaled,
        "attempt": summary.attempt + 1,
        "run_id": summary.run_id,
        "resume_from": decision.resume_from,
        "parent_flow_run_id": flow_run_id,
        "avoid_nodes": list(decision.avoid_nodes),
        "history": history,
    }


def lineage_tags(run_id: str, attempt: int, parent_flow_run_id: str | None) -> list[str]:
    """Tags that let the UI and automations find every attempt of a run."""
    tags = [f"{LINEAGE_TAG}:{run_id}", f"attempt:{attempt}"]
    if parent_flow_run_id:
        tags.append(f"parent:{parent_flow_run_id}")
    return tags
