"""A two-node Kubernetes attempt whose job forges its stacks index, error file and progress record, against kubesim.

Both pods of the Indexed Job run the job (tests/forged.py) under the entrypoint in their own
attempt folder; collection keeps each node's folder on this machine and the attempt is judged as
the attempt flow judges it (`judging.judge`), across its nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from forged import check_amplified, forger
from hostile import within
from test_multinode import two_nodes

from trainguard.core import judging
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.stores.folder import LocalEvidenceStore


@pytest.mark.parametrize("mode", ["amplify", "nested"])
def test_a_forging_job_on_two_nodes_is_judged_a_code_error_its_stacks_read_once(
        mode: str, kube: KubeApi, ns: str, tmp_path: Path) -> None:
    b = two_nodes(kube, ns, tmp_path, survivor_grace_seconds=30.0)
    ref = b.provision(f"mn-forged-{mode}", 1)
    launch = Launch(run_id=ref.run_id, attempt=1, command=(sys.executable, *forger(mode)), nodes=2, gpus=1)

    outcome = within(240, lambda: b.run(ref, launch), "the attempt to end")

    assert outcome.exit_code == 1, outcome
    within(120, lambda: b.collect_evidence(ref, LocalEvidenceStore(tmp_path / "evidence"), outcome), "evidence")
    nodes = b.node_signals(ref, outcome)
    assert len(nodes) == 2
    judged = within(60, lambda: judging.judge(b, ref, outcome), "the judgement")
    assert judged.diagnosis is not None and judged.diagnosis.category == "code_error", judged.diagnosis
    if mode == "amplify":
        for node in nodes:
            check_amplified(node.signals.stacks)
