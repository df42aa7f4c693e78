"""A tiny DDP training run over gloo that fails on purpose, the way real runs fail.

Run under torchrun (``python -m torch.distributed.run --nproc-per-node 2 train_ddp.py --fault
shape --fault-rank 1``). Every rank trains a small linear model on random data; at
``--fault-step`` the rank given by ``--fault-rank`` meets the fault, the others meet its
consequences. Nothing here prints an error of its own making: every message that ends a rank is
PyTorch's, Python's or the kernel's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

FAULTS = ("none", "shape", "type", "nonfinite", "data", "checkpoint", "sigkill", "memory",
          "hang", "desync", "loader_segfault", "loader_bug", "loader_hang", "xid")
# What the NVIDIA driver logs when a GPU falls off the bus (Xid 79). No GPU exists on the test
# machines: the "xid" fault prints the driver's line, as a node's log forwarder puts it in the pod's
# log, and the rank dies as one whose CUDA call never returns is killed.
XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples; one of them breaks its DataLoader worker when ``fault`` says so."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.labels = {i: i % 4 for i in range(64)}

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == 9 and self.fault == "loader_segfault":
            ctypes.string_at(0)  # a native library dereferencing NULL
        if index == 9 and self.fault == "loader_hang":
            time.sleep(3600)  # a worker stuck on a dead network filesystem
        if index == 9 and self.fault == "loader_bug":
            index = self.labels[index + 1000]  # a lookup with a key that is not there
        return torch.randn(16), torch.tensor(self.labels[index])


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout-seconds", type=float, default=60.0,
                        help="the collectives' timeout (the rendezvous keeps the default)")
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--fault-attempts", type=int, default=0,
                        help="meet the fault only in attempts up to this one (TRAINGUARD_ATTEMPT); 0 = in every run")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="rank 0 saves the model to TRAINGUARD_CHECKPOINT_DIR every N steps (0 = never)")
    parser.add_argument("--ignore-sigterm", action="store_true",
                        help="every rank ignores SIGTERM, as a rank stuck in native code or a careless handler does")
    return parser.parse_args()


def load_resume(model: torch.nn.Module) -> int:
    """The step to start from: the checkpoint trainguard names in TRAINGUARD_RESUME_FROM, loaded, else 0."""
    path = os.environ.get("TRAINGUARD_RESUME_FROM")
    if not path:
        return 0
    state = torch.load(path)
    model.load_state_dict(state["model"])
    print(f"resumed from {path} at step {state['step']}", flush=True)
    return int(state["step"])


def save_checkpoint(model: torch.nn.Module, step: int) -> None:
    """Rank 0 writes step-NNNNNN.pt atomically (a temporary name, then a rename), as a real run should."""
    folder = Path(os.environ["TRAINGUARD_CHECKPOINT_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".step-{step:06d}.pt.tmp"
    torch.save({"model": model.state_dict(), "step": step}, tmp)
    tmp.rename(folder / f"step-{step:06d}.pt")


def resume(model: torch.nn.Module, workdir: Path, rank: int, faulty: bool) -> None:
    """Load this rank's checkpoint shard; the faulty rank's shard was cut off mid-write."""
    shard = workdir / f"shard-rank{rank}.pt"
    torch.save(model.state_dict(), shard)
    if faulty:
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])
    model.load_state_dict(torch.load(shard))


def meet(fault: str, step_input: torch.Tensor, workdir: Path) -> torch.Tensor:
    """What the faulty rank does at the fault step instead of a normal step's input."""
    if fault == "shape":
        return torch.randn(8, 12)  # a batch from a differently configured pipeline
    if fault == "type":
        return step_input.view(8, 16, dtype=torch.float32)  # view() takes a shape or a dtype
    if fault == "nonfinite":
        return step_input * float("inf")
    if fault == "data":
        with open(workdir / "data" / "train-00001-of-00004.bin", "rb") as fh:
            fh.read()
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "xid":
        print(XID_LINE.format(pid=os.getpid()), file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "memory":
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        in_use = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (in_use + (256 << 20), hard))
        return torch.empty(1 << 30, 16)  # 64 GiB of activations asked for under a 256 MiB margin
    if fault == "hang":
        time.sleep(3600)  # a rank stuck outside the collectives (a deadlock, a slow filesystem)
    return step_input


@record
def main() -> None:
    args = parse()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    workdir = Path(args.workdir)
    dist.init_process_group("gloo")
    # A group of its own for training, so that a short collective timeout cannot cut a slow
    # start short: ranks start seconds apart on a loaded machine.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.timeout_seconds))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(16, 4), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "1"))
    faulty = rank == args.fault_rank and (args.fault_attempts == 0 or attempt <= args.fault_attempts)
    first = load_resume(model.module)
    if args.fault == "checkpoint":
        resume(model.module, workdir, rank, faulty)
    loader_fault = args.fault if faulty and args.fault.startswith("loader_") else "none"
    loader = DataLoader(Samples(loader_fault), batch_size=8, num_workers=1 if loader_fault
                        != "none" else 0)
    batches = iter(loader)
    for step in range(first, args.steps):
        x, y = next(batches)
        if faulty and step == args.fault_step:
            x = meet(args.fault, x, workdir)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if args.fault == "desync" and step == args.fault_step:
            # Per-class counts for a metric: a rank that saw an extra class sends a longer tensor.
            counts = torch.bincount(y, minlength=6 if faulty else 4).float()
            dist.all_reduce(counts, group=group)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if args.checkpoint_every and rank == 0 and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(model.module, step + 1)
        time.sleep(0.05)
    dist.barrier(group=group)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
