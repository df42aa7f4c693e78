"""What collection kept of one Kubernetes attempt on the flow's machine, read back once for triage.

The pods and their logs go with the Job, so collection keeps what triage reads in the attempt's
private folder (`localdir`): `TRIAGE_FACTS`, the `ClusterFacts` of the pod the attempt ended on;
its log as `KEPT_LOG`; and, for several pods, ``attempt.json`` with each node's files
(`nodes.keep_nodes`). `read` reads the triage facts once: a `KeptAttempt`, which hands triage
the attempt as one (`KeptAttempt.signals`) and each node rank (`KeptAttempt.nodes`, reading
``attempt.json`` once and each node's files, its events taken from the facts). Both join what
was kept with how the supervisor saw the attempt end (the `AttemptOutcome`), by one rule
(`_ending`): the outcome's reason and exit code belong to the pod it ended on, since a stall, a
deadline or a deleted Job is said by the supervisor alone, never by a pod.

Everything is read as the job's files are (regular files only, never through a link, bounded);
a field of the wrong type reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainguard_entrypoint.files import read_json_object

from trainguard.core.backends import rankstacks, torchrun, workspace
from trainguard.core.backends.base import AttemptOutcome
from trainguard.core.backends.capabilities import NodeEvidence
from trainguard.core.backends.workspace import (
    KEPT_LOG, KEPT_NODE_MAP, KEPT_PODS, KEPT_VOLUME, TRIAGE_FACTS, node_prefix,
)
from trainguard.core.backends.kubernetes.scene import ClusterFacts, as_int, as_list, as_text, as_wires
from trainguard.core.triage.signals import LogSource, Signals

UNSCHEDULABLE = "Unschedulable"
# Job-level reasons that say the Job failed but not why; the pod's own reason names the cause.
_JOB_VERDICTS = frozenset({"BackoffLimitExceeded", "PodFailurePolicy", "Error", "Failed"})


def read_facts(kept_dir: Path) -> ClusterFacts | None:
    """The triage facts kept in ``kept_dir``, their log only where it is the folder's own `KEPT_LOG`;
    None when none were kept (or they are no JSON object)."""
    kept = read_json_object(kept_dir / TRIAGE_FACTS)
    if kept is None:
        return None
    facts = ClusterFacts.from_dict(kept)
    return facts if facts.log_path in (None, str(kept_dir / KEPT_LOG)) else facts.with_log(None)


def read(kept_dir: Path | None, run_id: str, attempt: int) -> KeptAttempt:
    """What is kept in ``kept_dir`` for the attempt; nothing when None (the folder may not be trusted)."""
    return KeptAttempt(kept_dir, run_id, attempt, read_facts(kept_dir) if kept_dir is not None else None)


@dataclass(frozen=True)
class KeptAttempt:
    """One attempt's kept facts (`facts`, read once), and where each node rank's are (for several pods)."""

    kept_dir: Path | None
    run_id: str
    attempt: int
    facts: ClusterFacts | None

    def signals(self, outcome: AttemptOutcome) -> Signals:
        """The attempt as one: the outcome joined with the pod it ended on, with the conditions, events
        and log evidence kept (what the supervisor saw, where nothing was)."""
        facts = self.facts or ClusterFacts("", "")
        reason, exit_code = _ending(outcome, facts.reason, facts.exit_code)
        return Signals(exit_code=exit_code, reason=reason, conditions=facts.conditions or outcome.conditions,
                       events=facts.events or outcome.events, log=self.log(outcome))

    def log(self, outcome: AttemptOutcome) -> LogSource:
        """The attempt's log: the one collection kept, else the lines the supervisor saw."""
        path = self.facts.log_path if self.facts else None
        return Path(path) if path and Path(path).is_file() else (outcome.log_tail or None)

    def nodes(self, outcome: AttemptOutcome) -> list[NodeEvidence]:
        """Each node rank's signals and who it is, for an attempt of several pods; [] for one.

        The pod the attempt ended on (the outcome's, else node 0's) carries the outcome's reason. A pod
        never bound to a node when the attempt ended unschedulable carries that reason too: where no
        scheduler decided on it, nothing the cluster kept says so.
        """
        if self.kept_dir is None:
            return []
        mapped = read_json_object(self.kept_dir / KEPT_NODE_MAP) or {}
        entries = [e for e in as_list(mapped.get("indexes")) if isinstance(e, dict) and as_int(e.get("index")) is not None]
        if len(entries) < 2:
            return []
        ended = next((e["index"] for e in entries if outcome.instance and e.get("pod") == outcome.instance), 0)
        budget = rankstacks.StackBudget()
        return [self._node(self.kept_dir, entry, outcome, entry["index"] == ended, budget) for entry in entries]

    def _node(self, kept_dir: Path, entry: Mapping[str, Any], outcome: AttemptOutcome, ended: bool,
              budget: rankstacks.StackBudget) -> NodeEvidence:
        index, pod, node = int(entry["index"]), as_text(entry.get("pod")), as_text(entry.get("node"))
        folder = kept_dir / KEPT_VOLUME / node_prefix(index)
        reason, exit_code = as_text(entry.get("reason")), as_int(entry.get("exit_code"))
        if ended:  # the outcome's exit code is its own pod's: node 0 stands in for that pod with its reason alone
            told, code = _ending(outcome, reason, exit_code)
            reason, exit_code = told, code if pod is not None and pod == outcome.instance else exit_code
        if outcome.reason == UNSCHEDULABLE and node is None and not reason:
            reason = UNSCHEDULABLE
        own = folder / workspace.LOGS / workspace.log_name(self.run_id, self.attempt)
        pod_log = kept_dir / KEPT_PODS / f"{pod}.log"
        events = self.facts.events if self.facts else ()
        signals = Signals(
            exit_code=exit_code, reason=reason, conditions=as_wires(entry.get("conditions")),
            events=tuple(e for e in events if _about(e, pod, node)),
            log=own if own.is_file() else pod_log if pod and pod_log.is_file() else None,
            error_files=torchrun.nodes_error_files([(index, folder)]),
            stacks=rankstacks.read_stacks(folder, node, budget))
        ranks = [r for r in as_list(entry.get("ranks")) if as_int(r) is not None]
        # the error files date a rank's own failure to the second; without them the pod's end does
        return NodeEvidence(index, signals, node=node, instance=pod,
                            ranks=range(min(ranks), max(ranks) + 1) if ranks else None,
                            first_error_at=None if signals.error_files else _iso_epoch(entry.get("first_error_at")))


def _ending(outcome: AttemptOutcome, reason: str | None, exit_code: int | None) -> tuple[str | None, int | None]:
    """The reason and exit code of the pod the attempt ended on: the outcome's, but where the outcome has only
    the Job's bare verdict the pod's own reason (OOMKilled, Evicted, ...: the watch may have seen the Job fail
    before the pod's final status came), and the pod's exit code where the outcome has none."""
    told = reason if outcome.reason in _JOB_VERDICTS and reason else outcome.reason
    return told, outcome.exit_code if outcome.exit_code is not None else exit_code


def _about(event: Mapping[str, Any], pod: str | None, node: str | None) -> bool:
    involved = event.get("involvedObject") or {}
    return isinstance(involved, Mapping) and (involved.get("kind"), involved.get("name")) in (
        ("Pod", pod), ("Node", node))


def _iso_epoch(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
