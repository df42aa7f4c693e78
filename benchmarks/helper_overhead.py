"""The training-side helper's steady-state cost per step, vs the same DDP loop without it, in one run.

Two gloo ranks on the CPU train the DDP example's model (32→64→4, batch 32) in one process group.
The same loop runs in rounds, interleaved: ``--steps`` steps bare and ``--steps`` steps inside
`trainguard_train.Guard.steps` (agreement on a notice at its own cadence, the progress record once a
second, no periodic checkpoint: a save's cost is the save's, not a step's). Each round's time per
step is taken on rank 0 between barriers; the figures are the median over rounds of each, and the
median of each guarded round's time over the bare round's beside it (which goes first alternates). The helper's own agreement collective is timed as well (its median over the
warm-up), with the number of steps between agreements the guard chose; and the helper alone: its
step boundaries around an empty loop body on both ranks, agreements included, per step and as a share
of the bare step. The interleaved ratio is what a user sees, but on a shared machine its noise is
larger than the helper's cost; the helper alone is the cost itself. Usage:

    .venv/bin/python benchmarks/helper_overhead.py [--rounds 7] [--steps 400]

Goal: the helper costs ≤ 1 % of a step.

"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from trainguard_train import Guard  # noqa: E402

WORLD = 2


def _loop(ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor,
          steps: object, rank: int) -> None:
    for step in steps:  # type: ignore[attr-defined]
        start = (step * 32 + rank) % (len(inputs) - 32)
        loss = torch.nn.functional.cross_entropy(ddp(inputs[start:start + 32]), labels[start:start + 32])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def worker(rank: int, port: int, rounds: int, steps: int, folder: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRAINGUARD_CHECKPOINT_DIR=folder)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = DistributedDataParallel(model)
    inputs, labels = torch.randn(1024, 32), torch.randint(0, 4, (1024,))
    guard = Guard(ddp, optimizer)
    bare: list[float] = []
    guarded: list[float] = []
    with guard:
        # warm the allocator and gloo's buffers, and let the guard choose its cadence: steady state only
        _loop(ddp, optimizer, inputs, labels, range(50), rank)
        _loop(ddp, optimizer, inputs, labels, guard.steps(0, 50), rank)
        done = 50
        for index in range(rounds):
            order = (("bare", bare), ("guarded", guarded))
            for kind, times in order if index % 2 == 0 else order[::-1]:  # neither always goes first
                dist.barrier()
                started = time.perf_counter()
                loop_steps = guard.steps(done, done + steps) if kind == "guarded" else range(done, done + steps)
                _loop(ddp, optimizer, inputs, labels, loop_steps, rank)
                dist.barrier()
                times.append((time.perf_counter() - started) / steps)
                done += steps
        # the helper alone: its boundaries around an empty body, both ranks (the agreements included)
        dist.barrier()
        started = time.perf_counter()
        for _ in guard.steps(done, done + 20 * steps):
            pass
        alone = (time.perf_counter() - started) / (20 * steps)
    if rank == 0:
        check = statistics.median(guard._agree_seconds) if guard._agree_seconds else 0.0
        Path(out).write_text(json.dumps({"bare": bare, "guarded": guarded, "agree_seconds": check,
                                         "agree_every": guard.agree_every, "alone": alone}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        mp.spawn(worker, args=(port, args.rounds, args.steps, folder, out), nprocs=WORLD, join=True)
        result = json.loads(Path(out).read_text())
    bare, guarded = statistics.median(result["bare"]), statistics.median(result["guarded"])
    # each guarded round against the bare round beside it: load that changes between rounds cancels
    ratio = statistics.median(g / b for b, g in zip(result["bare"], result["guarded"]))
    print(f"DDP example step on the CPU, {WORLD} gloo ranks, median of {args.rounds} rounds of {args.steps} steps, "
          f"interleaved")
    print(f"  bare loop           {bare * 1e3:8.3f} ms/step")
    print(f"  inside Guard.steps  {guarded * 1e3:8.3f} ms/step")
    print(f"  ratio (paired)      {ratio:8.4f}x  (helper cost {100 * (ratio - 1):+.2f} % of a step; goal <= 1 %)")
    alone = result["alone"]
    print(f"  the helper alone    {alone * 1e6:8.2f} us/step = {100 * alone / bare:.2f} % of a bare step "
          f"(its boundaries around an empty body, agreements included)")
    print(f"  agreement collective {result['agree_seconds'] * 1e6:.0f} us, every {result['agree_every']} steps "
          f"(chosen from the warm-up)")
    print(json.dumps({"bare_ms": bare * 1e3, "guarded_ms": guarded * 1e3, "ratio": ratio, "alone_us": alone * 1e6,
                      "agree_us": result["agree_seconds"] * 1e6, "agree_every": result["agree_every"],
                      "rounds": {"bare": result["bare"], "guarded": result["guarded"]}}))


if __name__ == "__main__":
    main()
