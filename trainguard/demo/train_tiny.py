"""A tiny, real training loop on the CPU: linear regression by SGD, with resumable checkpoints.

Stdlib only, so it runs anywhere trainguard runs. It reads the checkpoint to resume from in
TRAINGUARD_RESUME_FROM and writes checkpoints atomically to TRAINGUARD_CHECKPOINT_DIR. For the demo
and the tests it can fail on purpose on a given attempt, printing what the real frameworks print.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

NCCL_TIMEOUT = (
    "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
    "ran for 600031 milliseconds before timing out.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an "
    "error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed "
    "NCCL work: {prev}.\n"
    "[rank1]:[E ProcessGroupNCCL.cpp:630] [Rank 1] Some NCCL operations have failed or timed out. Due to the "
    "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--fail-at-step", type=int, default=0)
    parser.add_argument("--fail-after-steps", type=int, default=0, help="fail after this many steps of an attempt")
    parser.add_argument(
        "--fail-on-attempt", type=int, action="append", default=[], help="attempts that fail (default: every one)"
    )
    parser.add_argument(
        "--failure", default="nccl-timeout", choices=["nccl-timeout", "type-error", "segfault", "hang"]
    )
    return parser.parse_args()


def load_state(path: str) -> dict[str, Any]:
    if not path:
        return {"step": 0, "w": 0.0, "b": 0.0}
    with open(path, encoding="utf-8") as fh:
        state: dict[str, Any] = json.load(fh)
    return state


def save_checkpoint(folder: Path, state: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{state['step']:06d}.json"
    tmp = folder / f".{final.name}.tmp"
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, final)
    return final


def fail(kind: str, step: int) -> None:
    print(f"step {step}: injecting failure {kind!r}", flush=True)
    if kind == "nccl-timeout":
        sys.stderr.write(NCCL_TIMEOUT.format(seq=step * 4, prev=step * 4 - 1))
        sys.stderr.flush()
        sys.exit(1)
    if kind == "type-error":
        len(step)  # type: ignore[arg-type]  # a genuine TypeError with a genuine traceback
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(3600)


def main() -> int:
    args = parse_args()
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "1"))
    folder = Path(os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "checkpoints"))
    resume = os.environ.get("TRAINGUARD_RESUME_FROM", "")
    state = load_state(resume)
    print(f"attempt {attempt}: resumed from step {state['step']} ({resume or 'no checkpoint'}), pid {os.getpid()}", flush=True)
    rng = random.Random(1234 + state["step"])
    failing = not args.fail_on_attempt or attempt in args.fail_on_attempt
    first_step = state["step"]
    while state["step"] < args.steps:
        state["step"] += 1
        x = rng.uniform(-1, 1)
        y = 3.0 * x + 2.0 + rng.gauss(0, 0.01)
        err = state["w"] * x + state["b"] - y
        state["w"] -= args.lr * err * x
        state["b"] -= args.lr * err
        if state["step"] % 5 == 0:
            print(f"step {state['step']}/{args.steps} loss {err * err:.5f} w {state['w']:.3f} b {state['b']:.3f}", flush=True)
        if state["step"] % args.checkpoint_every == 0:
            print(f"saved checkpoint {save_checkpoint(folder, state).name}", flush=True)
        due = state["step"] == args.fail_at_step or state["step"] - first_step == args.fail_after_steps
        if failing and due:
            fail(args.failure, state["step"])
        time.sleep(args.step_seconds)
    print(f"training finished at step {state['step']}: w={state['w']:.3f} b={state['b']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
