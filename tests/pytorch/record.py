"""Record real runs as test data that needs no torch: the corpus and the two-node matrix.

    python tests/pytorch/record.py corpus   # tests/triage/corpus/pytorch.jsonl
    python tests/pytorch/record.py matrix   # tests/triage/recorded/two_nodes.jsonl

Each scenario of ``pytorch_runs`` is run for real (two at a time) and its output kept with
what the evidence allows us to expect. The outputs are trimmed, nothing else: progress lines,
torchrun's OMP banner, Lightning's tips and the ^^^ markers under traceback lines are dropped,
and the run's temporary folder, this
checkout and the virtualenv are written as /job, /src and /opt/venv so that the files do not
change with where they were recorded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from pytorch_runs import SCENARIOS, NodeRun, Run, Scenario, matrix, run

REPO = Path(__file__).resolve().parents[2]
TRIAGE = REPO / "tests" / "triage"
_NOISE = re.compile(r"^(?:\[default\d+\]:)?(?:\[rank\d+\]:)?(?:step \d+ loss [\d.a-z]+|\*{20,}"
                    r"|Setting OMP_NUM_THREADS.*|.*💡 Tip: .*|\s*[\^~]+\s*)$")


def trimmed(text: str, workdir: Path) -> str:
    text = text.replace(str(workdir), "/job").replace(str(Path(sys.prefix)), "/opt/venv")
    text = text.replace(str(REPO), "/src")
    return "\n".join(line for line in text.splitlines() if not _NOISE.match(line)) + "\n"


def command(s: Scenario) -> str:
    where = "--standalone" if s.nodes == 1 else f"--nnodes {s.nodes} --node-rank <0|1>"
    return (f"python -m torch.distributed.run {where} --nproc-per-node {s.nproc} --redirects 3 "
            f"--tee 3 tests/pytorch/scripts/{s.script} {' '.join(s.args)}")


def node_record(node: NodeRun, s: Scenario, workdir: Path) -> dict[str, Any]:
    return {
        "index": node.node_rank, "node": f"node{node.node_rank}",
        "ranks": [node.node_rank * s.nproc, (node.node_rank + 1) * s.nproc],
        "exit_code": node.returncode,
        "log": trimmed(node.output.decode("utf-8", "replace"), workdir),
        "error_files": [{"source": trimmed(path, workdir).strip(), "rank": rank,
                         "content": trimmed(text, workdir)}
                        for rank, (path, text) in sorted(node.error_files.items())],
        "agent_error": trimmed(node.agent_error, workdir) if node.agent_error else None,
    }


def run_all(scenarios: list[Scenario], jobs: int) -> list[tuple[Run, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="trainguard-record-"))

    def one(s: Scenario) -> tuple[Run, Path]:
        print(f"running {s.name}", file=sys.stderr, flush=True)
        return run(s, folder / s.name), folder / s.name

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, scenarios))


def record_matrix(jobs: int) -> None:
    rows = []
    for result, workdir in run_all(matrix(), jobs):
        s = result.scenario
        rows.append({
            "id": s.name, "fault": s.args[1], "culprit_rank": int(s.args[3]),
            "fault_step": int(s.args[5]), "category": s.category, "retryable": s.retryable,
            "rank": s.rank, "torch": torch.__version__, "command": command(s),
            "parts": [node_record(n, s, workdir) for n in result.nodes]})
    out = TRIAGE / "recorded" / "two_nodes.jsonl"
    out.parent.mkdir(exist_ok=True)
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


WHY = {
    "shape": "Rank 1 fed the model a batch of the wrong width (mat1 and mat2 shapes); rank 0 only lost its peer (gloo 'Connection closed by peer') and torchrun SIGTERMed it.",
    "type": "Rank 0 called view() with arguments it does not take (TypeError); rank 1 only lost its peer.",
    "nonfinite": "An inf in rank 1's batch made every rank's all-reduced gradients non-finite; clip_grad_norm_(error_if_nonfinite=True) refused them: divergence, not a code bug.",
    "data": "Rank 1 of 3 could not open its data shard (FileNotFoundError); ranks 0 and 2 only lost their peer.",
    "checkpoint": "Rank 1 resumed from a checkpoint shard cut off mid-write (PytorchStreamReader failed reading zip archive); an earlier checkpoint would do.",
    "sigkill": "Rank 1 was SIGKILLed (exitcode -9) with no word about memory: a bare kill is unknown, retried once; rank 0's 'Connection closed by peer' is its consequence.",
    "memory": "Rank 1 asked for 64 GiB under a real address-space limit: DefaultCPUAllocator can't allocate memory, a host OOM.",
    "hang": "Rank 1 of 3 hung outside the collectives; ranks 0 and 2 hit gloo's 4 s timeout and torchrun SIGTERMed rank 1: every rank's own error is a lost peer, the culprit is undetermined and the communication failure is retried.",
    "desync": "Rank 1 all-reduced a longer tensor than rank 0; gloo's pair.cc enforce check aborted rank 0 and torchrun SIGTERMed rank 1: a collective mismatch whose culprit the evidence does not name.",
    "loader_segfault": "A DataLoader worker of rank 0 segfaulted in native code; rank 0's 'DataLoader worker ... is killed by signal: Segmentation fault' names it.",
    "loader_bug": "A DataLoader worker of rank 1 raised KeyError from the dataset's own lookup (Caught KeyError in DataLoader worker process 0).",
    "lightning_shape": "Lightning DDP: rank 1's training_step fed a batch of the wrong width after a ModelCheckpoint save; rank 0 only lost its peer.",
    "lightning_checkpoint": "Lightning resumed both ranks from last.ckpt cut off mid-write: a corrupt checkpoint, retried from an earlier one.",
}


def record_corpus(jobs: int) -> None:
    names = [n for n, s in SCENARIOS.items() if s.nodes == 1] + ["two_nodes_shape"]
    rows = []
    for result, workdir in run_all([SCENARIOS[n] for n in names], jobs):
        s = result.scenario
        source = f"tests/pytorch/scripts/{s.script} (torch {torch.__version__}, {command(s)})"
        for node in result.nodes:
            record = node_record(node, s, workdir)
            row: dict[str, Any] = {"id": f"p-{s.name}", "source": source, "log": record["log"],
                                   "exit_code": node.returncode, "reason": None, "events": None,
                                   "category": s.category, "retryable": s.retryable,
                                   "why": WHY.get(s.name, "")}
            if s.nodes > 1:
                innocent = s.rank is not None and s.rank // s.nproc != node.node_rank
                row["id"] += f"-node{node.node_rank}"
                if innocent:  # this node's log alone holds only victims: a retryable loss
                    row.update(category="nccl_error", retryable=True, why=(
                        "The healthy node of a two-node run: its ranks only lost their peer "
                        "(gloo 'Connection closed by peer') and its torchrun report still names "
                        "one of them the root cause; alone, it shows a communication failure."))
                else:
                    row["why"] = ("The failing node of a two-node run: rank 3 fed the model a "
                                  "batch of the wrong width; rank 2 only lost its peer.")
            rows.append(row)
            if s.name == "shape" and record["agent_error"]:
                rows.append({**row, "id": "p-shape-error-file-only", "log": None,
                             "error_files": [record["agent_error"]],
                             "why": "Only torchrun's TORCHELASTIC_ERROR_FILE (the agent's copy "
                                    "of its root-cause rank's error): the traceback decides."})
    (TRIAGE / "corpus" / "pytorch.jsonl").write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("corpus", "matrix"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    record_corpus(args.jobs) if args.what == "corpus" else record_matrix(args.jobs)


if __name__ == "__main__":
    main()
