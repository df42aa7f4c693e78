"""The victim rule as the command line shows it, and the engine's weak calls and ties.

Real torchrun output comes from the recorded runs (``recorded/two_nodes.jsonl``, see
``test_triage_victims``). Text typed here is either not PyTorch's (user rules, to make a tie) or
NCCL's, which needs GPUs this machine does not have; such cases say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage.rules import RuleFileError

REPO = Path(__file__).parents[2]
ROWS = [json.loads(line) for line in
        (Path(__file__).parent / "recorded" / "two_nodes.jsonl").read_text().splitlines()]


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from trainguard.cli import main; main()", "classify", *args],
        input=stdin, capture_output=True, cwd=REPO, env=env, timeout=120, check=False)


def node(fault: str, rank: int, index: int) -> dict[str, object]:
    row = next(r for r in ROWS if (r["fault"], r["culprit_rank"], r["fault_step"]) == (
        fault, rank, 3))
    part: dict[str, object] = row["parts"][index]
    return part


def test_explain_prints_the_culprit_rank_and_each_victim_with_its_reason(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    log.write_text(str(node("shape", 2, 1)["log"]))
    done = cli(str(log), "--exit-code", "1", "--explain")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "culprit: rank 2" in out
    assert "passed over: rank 3 (" in out
    assert "(victim)" in out


def test_the_json_answer_carries_the_victims_and_an_undetermined_culprit(tmp_path: Path) -> None:
    log = tmp_path / "node0.log"
    log.write_text(str(node("shape", 2, 0)["log"]))  # the healthy node: only lost peers
    done = cli(str(log), "--exit-code", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["category"], result["retryable"]) == ("nccl_error", True)
    assert result["culprit_undetermined"] is True and result["rank"] is None
    assert {v["rank"] for v in result["victims"]} == {0, 1}
    assert all(v["reason"] for v in result["victims"])


def test_error_files_on_the_command_line_and_in_batch_records(tmp_path: Path) -> None:
    failing = node("data", 1, 0)
    agent = tmp_path / "agent-error.json"
    agent.write_text(str(failing["agent_error"]))
    empty = tmp_path / "rank0-error.json"
    empty.write_text("")  # a rank killed by a signal leaves it empty
    done = cli("--exit-code", "1", "--error-file", str(agent), "--error-file", str(empty),
               "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["category"] == "data_error"
    record = {"exit_code": 1, "error_files": [{"content": failing["agent_error"], "rank": 1}]}
    batch = cli("--jsonl", "-", stdin=json.dumps(record).encode() + b"\n")
    assert batch.returncode == 0, batch.stderr
    result = json.loads(batch.stdout)
    assert (result["category"], result["rank"]) == ("data_error", 1) and result["failed_at"]
    bad = cli("--jsonl", "-", stdin=b'{"error_files": 3}\n')
    assert bad.returncode == 2 and b"error_files" in bad.stderr


def test_a_tie_between_categories_broken_by_rule_order_is_a_weak_call(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("""
rules:
  - id: site.widget_config
    category: config_error
    strength: error
    log: ['widget failure']
  - id: site.widget_data
    category: data_error
    strength: error
    log: ['widget failure']
""")
    explanation = triage.explain(triage.Signals(exit_code=1, log="widget failure\n"),
                                 rules=triage.load_rules(rules))
    d = explanation.diagnosis
    assert d is not None and d.rule_id == "site.widget_config"
    assert d.decided_by == "rule order" and d.weak and d.to_dict()["weak"] is True
    assert "rule order: a weak call" in explanation.reason
    assert d.remediation.startswith("Weak call")


def test_equal_evidence_of_one_category_is_no_weak_call() -> None:
    d = triage.classify(triage.Signals(exit_code=139, log=(
        "Segmentation fault (core dumped)\nFatal Python error: Segmentation fault\n")))
    assert d is not None and d.category is Category.NATIVE_CRASH and not d.weak


@pytest.mark.parametrize("flag", ["victim", "wrapper"])
def test_victim_and_wrapper_are_booleans_in_a_rule_file(tmp_path: Path, flag: str) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"rules:\n  - id: site.x\n    category: nccl_error\n    {flag}: maybe\n"
                     "    log: ['x']\n")
    with pytest.raises(RuleFileError, match=f"{flag}: expected true or false"):
        triage.load_rules(rules)


# Typed by hand: NCCL needs GPUs. The watchdog's timeout on the surviving ranks, the abort it
# takes their processes down with, and the culprit's CUDA OOM, as torch 2.x prints them.
WATCHDOG = ("[rank{r}]:[E1202 07:00:0{r}.000000000 ProcessGroupNCCL.cpp:616] [Rank {r}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
            "Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n")
ABORT = ("terminate called after throwing an instance of 'c10::DistBackendError'\n"
         "  what():  [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread "
         "terminated with exception: [Rank {r}] Watchdog caught collective operation timeout\n")


def test_an_unranked_abort_beside_watchdog_timeouts_is_their_teardown_not_a_crash() -> None:
    log = WATCHDOG.format(r=0) + ABORT.format(r=0) + WATCHDOG.format(r=2) + ABORT.format(r=2)
    d = triage.classify(triage.Signals(exit_code=-6, log=log))
    assert d is not None and (d.category, d.retryable) == (Category.NCCL_ERROR, True)
    assert d.culprit_undetermined and {v.rank for v in d.victims} == {0, 2}
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    found = triage.classify(triage.Signals(exit_code=-6, log=log + oom))
    assert found is not None and (found.category, found.rank) == (Category.CUDA_OOM, 1)


# torchrun's report of the first worker to exit, where all it knows is the signal that ended it
REPORTED = ("Root Cause (first observed failure):\n[0]:\n  time      : 2024-07-26_10:59:45\n  host      : node-1\n"
            "  rank      : 0 (local_rank: 0)\n  exitcode  : {code} (pid: 214033)\n  error_file: <N/A>\n"
            "  traceback : Signal {signal} ({name}) received by PID 214033\n")
SOME_FAILED = ("[rank1]:[E726 10:59:44.365679787 ProcessGroupNCCL.cpp:621] [Rank 1] Some NCCL operations have failed "
               "or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
               "corrupted/incomplete data.\n")


def test_a_rank_that_only_aborted_beside_a_collectives_failure_is_its_watchdogs_teardown() -> None:
    """NCCL's watchdog takes every rank that saw the collective fail down with SIGABRT; the rank torchrun saw exit
    first, with nothing of its own but that signal, is one of them, not a native crash. A rank that died of a
    segfault did crash: it stays the culprit, and so does an abort beside nothing but the agent's closing of the
    rest. (NCCL's lines are typed here: this machine has no GPU.)"""
    aborted = triage.classify(triage.Signals(
        exit_code=1, log=SOME_FAILED + REPORTED.format(code=-6, signal=6, name="SIGABRT")))
    assert aborted is not None and (aborted.category, aborted.retryable) == (Category.NCCL_ERROR, True)
    assert aborted.culprit_undetermined
    crashed = triage.classify(triage.Signals(
        exit_code=1, log=SOME_FAILED + REPORTED.format(code=-11, signal=11, name="SIGSEGV")))
    assert crashed is not None and (crashed.category, crashed.rank) == (Category.NATIVE_CRASH, 0)
    # Ranks its agent closed once it aborted say nothing of a collective: the abort is its rank's own.
    closed = "".join(f"[2024-04-06 17:34:36,014] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending "
                     f"process {pid} closing signal SIGTERM\n" for pid in (70491, 70493))
    alone = triage.classify(triage.Signals(
        exit_code=1, log=closed + REPORTED.format(code=-6, signal=6, name="SIGABRT")))
    assert alone is not None and (alone.category, alone.rank) == (Category.NATIVE_CRASH, 0)


def test_a_single_processs_watchdog_timeout_alone_leaves_the_culprit_undetermined() -> None:
    d = triage.classify(triage.Signals(exit_code=1, log=WATCHDOG.format(r=5)[len("[rank5]:"):]))
    assert d is not None and d.category is Category.NCCL_ERROR and d.culprit_undetermined


@pytest.mark.parametrize("extra,complaint", [
    ("    victim: true\n    pid_group: 2\n", "has no group 2"),
    ("    pid_group: 1\n", "victim: true"),
    ("    victim: true\n    pid_group: first\n", "expected the number"),
])
def test_a_pid_group_names_a_group_of_a_victim_rules_patterns(
        tmp_path: Path, extra: str, complaint: str) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: site.killer\n    category: unknown\n"
                     "    log: ['killing worker (\\d+)']\n" + extra)
    with pytest.raises(RuleFileError, match=complaint):
        triage.load_rules(rules)
