"""The DDP example's loop under `trainguard_train`, with faults to meet on purpose.

``--fault sigkill`` SIGKILLs ``--fault-rank`` in step ``--fault-step`` (1-based: after
``--fault-step - 1`` steps completed, before its gradients are all-reduced), in the attempts up to
``--fault-attempts``. ``--save-fault die|slow`` makes the save of a checkpoint other than a periodic
one die half-written or take ``--slow-seconds``. ``--announce`` prints a line when the loop starts,
so a test knows when to give notice. ``--hook`` uses the guard as a loop that owns its checkpoint
code does: its own save function, called with the step, and `step_done` after each optimizer step.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import trainguard_train as tg
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--fault", choices=("none", "sigkill"), default="none")
    parser.add_argument("--fault-rank", type=int, default=3)
    parser.add_argument("--fault-step", type=int, default=17)
    parser.add_argument("--fault-attempts", type=int, default=1)
    parser.add_argument("--save-fault", choices=("none", "die", "slow"), default="none")
    parser.add_argument("--slow-seconds", type=float, default=20.0)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--hook", action="store_true")
    return parser.parse_args()


@record
def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "1"))
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp = DistributedDataParallel(model)
    inputs, labels = torch.randn(1024, 32), torch.randint(0, 4, (1024,))
    periodic = {step for step in range(args.checkpoint_every, args.steps + 1, args.checkpoint_every)}

    def save(step: int, path: Path) -> None:
        """The loop's own save; faulty for a save that is not a periodic one, when asked."""
        faulty = args.save_fault != "none" and step not in periodic and attempt <= args.fault_attempts
        if faulty and args.save_fault == "die":
            path.write_bytes(b"half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)
        if faulty and args.save_fault == "slow":
            time.sleep(args.slow_seconds)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)

    def load(path: Path) -> int:
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    faulty = args.fault == "sigkill" and rank == args.fault_rank and attempt <= args.fault_attempts
    with tg.Guard(ddp, optimizer, save=save, load=load, every=args.checkpoint_every) as guard:
        first = guard.resume()
        print(f"rank {rank} starts at step {first}", flush=True)
        steps = range(first, args.steps) if args.hook else guard.steps(first, args.steps)
        for step in steps:
            start = (step * 32 + rank) % (len(inputs) - 32)
            loss = torch.nn.functional.cross_entropy(ddp(inputs[start:start + 32]), labels[start:start + 32])
            optimizer.zero_grad()
            if faulty and step + 1 == args.fault_step:
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
            if args.hook:
                guard.step_done(step + 1)
            time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
