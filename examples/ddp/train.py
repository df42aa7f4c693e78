"""A real DDP training script that trainguard can retry from its last checkpoint.

Run it with torchrun and nothing else on the command line: trainguard gives every node the
rendezvous (`PET_NNODES`, `PET_NODE_RANK`, `PET_NPROC_PER_NODE`, `PET_MASTER_ADDR`/`PORT`), so the
same spec runs on one node or sixty-four (see `spec-1-node.yaml` and `spec-2-nodes.yaml`):

    command: [torchrun, examples/ddp/train.py, --steps, "200"]

What makes it retryable from where it failed:
- rank 0 saves a checkpoint every `--checkpoint-every` steps into `TRAINGUARD_CHECKPOINT_DIR`
  (the run's folder every attempt shares), under a temporary name first and then renamed, so a
  crash mid-save never leaves a checkpoint that looks whole;
- every rank loads `TRAINGUARD_RESUME_FROM` when trainguard names one (a retry), and goes on from
  the step it holds;
- `main` is wrapped in torchelastic's `record`, so a rank's uncaught exception lands in its error
  file, which trainguard reads to name the rank that failed first.

NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps in all")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (to watch it run)")
    parser.add_argument("--batch-size", type=int, default=32)
    return parser.parse_args()


def resume(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Load the checkpoint trainguard names, if any; return the step to go on from."""
    path = os.environ.get("TRAINGUARD_RESUME_FROM")
    if not path:
        return 0
    state = torch.load(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"resumed from {path} at step {state['step']}", flush=True)
    return int(state["step"])


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write step-NNNNNN.pt whole or not at all: a temporary name, then a rename."""
    folder = Path(os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "checkpoints"))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".step-{step:06d}.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    tmp.rename(folder / f"step-{step:06d}.pt")
    print(f"saved checkpoint step-{step:06d}.pt", flush=True)


@record
def main() -> None:
    args = parse()
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(1234)  # the same data on every attempt, so a resumed run sees what it would have
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first = resume(model, optimizer, device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    inputs, labels = torch.randn(1024, 32, device=device), torch.randint(0, 4, (1024,), device=device)
    for step in range(first, args.steps):
        start = (step * args.batch_size + rank) % (len(inputs) - args.batch_size)
        x, y = inputs[start:start + args.batch_size], labels[start:start + args.batch_size]
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
            if (step + 1) % args.checkpoint_every == 0:
                save(model, optimizer, step + 1)
        time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
