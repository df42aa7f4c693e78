"""Real PyTorch through the attempt flow on the local backend: DDP over gloo under torchrun, two ranks.

Each test runs real training scripts (tests/pytorch/scripts, examples/) as a run's command, with
nothing on torchrun's command line but the script: trainguard gives the rendezvous, where each
rank's log goes and torchelastic's error file. What is asserted is what a person reads in the
verdict: the category, the retry decision, the rank that failed first and the ranks it took down
with it, and the checkpoint a retry resumed from. Every message that ends a rank is PyTorch's or
Python's own; nothing here types one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from flow_helpers import run

from trainguard.core.reports import attempt as attempt_report
from trainguard_entrypoint import acks

ROOT = Path(__file__).resolve().parents[2]
DDP = str(ROOT / "tests" / "pytorch" / "scripts" / "train_ddp.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def ddp_spec(name: str, *args: str, tmp_path: Path, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": [*TORCHRUN, DDP, "--workdir", str(tmp_path), *args],
            "processes_per_node": 2, "retry": {"max_attempts": 3, "delay_seconds": 0}, **fields}


def test_a_shape_mismatch_on_rank_1_is_its_code_error_not_its_peers_and_is_not_retried(blocks, tmp_path) -> None:
    state, attempts = run(ddp_spec("ddp-shape", "--fault", "shape", "--fault-rank", "1", tmp_path=tmp_path),
                          blocks, "ddp-shape-1", as_summaries=True)
    assert state.is_failed() and len(attempts) == 1
    only = attempts[0]
    assert (only.category, only.retryable, only.decision.retry) == ("code_error", False, False)
    assert only.root_cause and only.root_cause["rank"] == 1
    assert "mat1 and mat2 shapes cannot be multiplied" in (only.signature or "")
    verdict = json.loads((blocks["evidence"] / "runs" / "ddp-shape-1" / "attempt-1" / "verdict.json").read_text())
    assert verdict["root_cause"]["rank"] == 1 and verdict["rule_id"] == only.rule_id
    assert attempt_report.table_row(only)["rank"] == "1"


def test_a_hang_in_a_collective_is_retried_from_the_last_checkpoint_and_the_retry_succeeds(blocks, tmp_path) -> None:
    """Rank 1 stops answering at step 4 in the first attempt only; rank 0 meets gloo's own timeout."""
    spec = ddp_spec("ddp-hang", "--fault", "hang", "--fault-rank", "1", "--fault-step", "4", "--fault-attempts", "1",
                    "--checkpoint-every", "2", "--steps", "6", "--timeout-seconds", "4", tmp_path=tmp_path)
    state, attempts = run(spec, blocks, "ddp-hang-1", as_summaries=True)
    assert state.is_completed() and [a.state for a in attempts] == ["Failed", "Completed"]
    first, second = attempts
    assert (first.category, first.retryable, first.decision.retry) == ("nccl_error", True, True)
    assert first.culprit_undetermined and attempt_report.rank_cell(first) == "?"
    assert second.resumed_from and Path(second.resumed_from).name == "step-000004.pt"


def test_a_rank_killed_without_memory_evidence_is_unknown_retried_once_and_said_to_be_weak(blocks, tmp_path) -> None:
    spec = ddp_spec("ddp-kill", "--fault", "sigkill", "--fault-rank", "1", "--fault-step", "3",
                    "--checkpoint-every", "1", "--steps", "6", tmp_path=tmp_path)
    state, attempts = run(spec, blocks, "ddp-kill-1", as_summaries=True)
    assert state.is_failed() and len(attempts) == 2  # unknown is retried once, then the same again stops the run
    assert [a.category for a in attempts] == ["unknown", "unknown"]
    assert attempts[0].decision.retry and not attempts[1].decision.retry
    assert attempts[0].root_cause and attempts[0].root_cause["rank"] == 1
    assert Path(attempts[1].resumed_from or "").name == "step-000003.pt"
    assert attempts[0].weak and attempt_report.table_row(attempts[0])["category"] == "unknown (weak)"
    assert "check the deciding log line" in attempt_report.render_attempt(attempts[0])


def test_the_ddp_example_runs_as_its_spec_says_and_checkpoints_into_the_runs_folder(blocks) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "ddp" / "spec-1-node.yaml").read_text())
    torchrun = spec["command"].index("torchrun")
    spec["command"][torchrun:torchrun + 2] = [*TORCHRUN, str(ROOT / "examples" / "ddp" / "train.py")]
    spec["command"][spec["command"].index("--steps") + 1] = "8"
    spec["command"][spec["command"].index("--checkpoint-every") + 1] = "4"
    state, attempts = run(spec, blocks, "ddp-example-1", as_summaries=True)
    assert state.is_completed() and len(attempts) == 1
    folder = blocks["work"] / "runs" / "ddp-example-1" / "checkpoints"
    checkpoints = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert checkpoints == ["step-000004.pt", "step-000008.pt"]
    for name, step in (("step-000004.pt", 4), ("step-000008.pt", 8)):  # each acknowledged, and it verifies
        ack = acks.read_ack(folder, name)
        assert ack is not None and (ack.step, ack.kind) == (step, "periodic") and acks.verify(folder, ack) is None
    assert Path(attempts[0].newest_checkpoint or "").name == "step-000008.pt"


def test_the_lightning_example_runs_under_torchrun_and_keeps_its_checkpoints_in_the_runs_folder(blocks) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "lightning" / "spec.yaml").read_text())
    torchrun = spec["command"].index("torchrun")
    spec["command"][torchrun:torchrun + 2] = [*TORCHRUN, str(ROOT / "examples" / "lightning" / "train.py")]
    spec["command"][spec["command"].index("--epochs") + 1] = "2"
    state, attempts = run(spec, blocks, "lightning-example-1", as_summaries=True)
    assert state.is_completed() and len(attempts) == 1
    checkpoints = {p.name for p in (blocks["work"] / "runs" / "lightning-example-1" / "checkpoints").iterdir()}
    assert "last.ckpt" in checkpoints and any(name.startswith("epoch=1-") for name in checkpoints)
