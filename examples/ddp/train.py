"""A real DDP training script that trainguard can retry from its last checkpoint.

Run it with torchrun and nothing else on the command line: trainguard gives every node the
rendezvous (`PET_NNODES`, `PET_NODE_RANK`, `PET_NPROC_PER_NODE`, `PET_MASTER_ADDR`/`PORT`), so the
same spec runs on one node or sixty-four (see `spec-1-node.yaml` and `spec-2-nodes.yaml`):

    command: [torchrun, examples/ddp/train.py, --steps, "200"]

What makes a failure cost one step: `trainguard_train` (trainguard puts it on the training's path),
wrapped around the loop in three lines:
- a periodic checkpoint every `--checkpoint-every` steps into `TRAINGUARD_CHECKPOINT_DIR` (the run's
  folder every attempt shares), written under a temporary name, fsynced and renamed, then
  acknowledged (`.trainguard-acks/`: step, files, SHA-256);
- on a notice (SIGTERM, Ctrl-C, a pod's eviction, Slurm's `--signal`) all ranks agree on one step,
  rank 0 saves it before the deadline and the attempt ends;
- when a rank dies without warning, one survivor saves the state after the last completed step;
- `guard.resume()` loads `TRAINGUARD_RESUME_FROM` when trainguard names one (a retry);
- `main` is wrapped in torchelastic's `record`, so a rank's uncaught exception lands in its error
  file, which trainguard reads to name the rank that failed first.

NCCL on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import trainguard_train as tg
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps in all")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (to watch it run)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--kill-rank", type=int, default=-1,
                        help="to see a survivor's just-in-time checkpoint: this rank SIGKILLs itself in the first "
                             "attempt, in step --kill-at-step, before its gradients are all-reduced")
    parser.add_argument("--kill-at-step", type=int, default=0)
    return parser.parse_args()


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
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    inputs, labels = torch.randn(1024, 32, device=device), torch.randint(0, 4, (1024,), device=device)
    with tg.Guard(ddp, optimizer, every=args.checkpoint_every) as guard:
        for step in guard.steps(guard.resume(), args.steps):
            start = (step * args.batch_size + rank) % (len(inputs) - args.batch_size)
            x, y = inputs[start:start + args.batch_size], labels[start:start + args.batch_size]
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            if rank == args.kill_rank and step + 1 == args.kill_at_step and os.environ.get("TRAINGUARD_ATTEMPT") == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
            time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
