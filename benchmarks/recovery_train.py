"""The recovery benchmark's training script: real DDP on gloo that says when each phase of its start ended.

Run under torchrun. Rank 0 appends one JSON line per moment to `$RECOVERY_CONTROL/timeline.jsonl`
(and prints the usual `step N loss X` line): `start` (the worker's and torchrun agent's process
start times, read from /proc, so Python's and torch's imports count where they happen), `rendezvous`
(init_process_group returned), `loaded` (the checkpoint named by TRAINGUARD_RESUME_FROM, or with
`--resume-newest` the newest in the folder as a torchelastic restart finds it, is in the model) and
`step` for every optimizer step completed. Every rank writes its pid to `rank<R>.pid`, so the
benchmark can kill it; a rank that finds `hang-rank<R>` there stops answering (it sleeps, as a rank
stuck on a dead filesystem does) and says so with `hung-rank<R>`.

Checkpoints, as `examples/ddp/train.py` takes them: `trainguard_train`'s guard around the loop saves a
periodic checkpoint every `--checkpoint-every` steps, one on notice (all ranks agree on the step) and
one from a survivor when a rank dies without warning, each acknowledged. With `--periodic-only` the
script saves `step-NNNNNN.pt` itself every `--checkpoint-every` steps (rank 0, atomically) and nothing
else: a training without the helper, the benchmark's baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

CONTROL = Path(os.environ.get("RECOVERY_CONTROL", "."))


def process_start(pid: int) -> float | None:
    """When process `pid` started (unix seconds), from /proc, to 10 ms; None where /proc cannot say.

    /proc/<pid>/stat gives the start in clock ticks since boot; /proc/uptime says how long ago the
    boot was to 10 ms (/proc/stat's btime is whole seconds, too coarse to order the moments).
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        now, uptime = time.time(), float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return now - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def note(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, "at": time.time(), "attempt": os.environ.get("TRAINGUARD_ATTEMPT", ""),
                       "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), **fields})
    with (CONTROL / "timeline.jsonl").open("a") as out:
        out.write(line + "\n")


def newest_checkpoint(folder: Path) -> str:
    found = sorted(folder.glob("step-*.pt"))
    return str(found[-1]) if found else ""


def one_step(step: int, rank: int, ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
             labels: torch.Tensor) -> float:
    if (CONTROL / f"hang-rank{rank}").exists():
        (CONTROL / f"hung-rank{rank}").write_text(str(step))
        while True:
            time.sleep(60)
    start = (step * 32 + rank) % (len(inputs) - 32)
    loss = torch.nn.functional.cross_entropy(ddp(inputs[start:start + 32]), labels[start:start + 32])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.item())


def guarded(args: argparse.Namespace, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            inputs: torch.Tensor, labels: torch.Tensor) -> None:
    """The loop inside trainguard_train's guard, as examples/ddp/train.py runs it."""
    import trainguard_train as tg

    with tg.Guard(model, optimizer, every=args.checkpoint_every) as guard:
        first = guard.resume()  # TRAINGUARD_RESUME_FROM, when trainguard names one
        if rank == 0:
            path = os.environ.get("TRAINGUARD_RESUME_FROM", "")
            note("loaded", step=first, checkpoint=Path(path).name if path else None)
        ddp = DistributedDataParallel(model)  # its parameter broadcast counts in the first step
        for step in guard.steps(first, args.steps):
            loss = one_step(step, rank, ddp, optimizer, inputs, labels)
            if rank == 0:
                print(f"step {step + 1} loss {loss:.4f}", flush=True)
                note("step", step=step + 1)
            time.sleep(args.step_seconds)


def periodic_only(args: argparse.Namespace, rank: int, folder: Path, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor) -> None:
    """The loop with the script's own periodic checkpoints and nothing else."""
    path = newest_checkpoint(folder) if args.resume_newest else os.environ.get("TRAINGUARD_RESUME_FROM", "")
    first = 0
    if path:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = int(state["step"])
    if rank == 0:
        note("loaded", step=first, checkpoint=Path(path).name if path else None)
    ddp = DistributedDataParallel(model)  # its parameter broadcast counts in the first step
    for step in range(first, args.steps):
        loss = one_step(step, rank, ddp, optimizer, inputs, labels)
        if rank == 0:
            print(f"step {step + 1} loss {loss:.4f}", flush=True)
            note("step", step=step + 1)
            if (step + 1) % args.checkpoint_every == 0:
                tmp = folder / f".step-{step + 1:06d}.pt.tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, tmp)
                tmp.rename(folder / f"step-{step + 1:06d}.pt")
        time.sleep(args.step_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--resume-newest", action="store_true",
                        help="resume from the newest checkpoint in the folder (torchelastic restarts in place)")
    parser.add_argument("--periodic-only", action="store_true",
                        help="periodic checkpoints only, saved by the script itself (no trainguard_train)")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(os.environ.get("TRAINGUARD_CHECKPOINT_DIR") or CONTROL / "checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    (CONTROL / f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 0:
        note("start", worker=process_start(os.getpid()), agent=process_start(os.getppid()))
    dist.init_process_group("gloo")
    if rank == 0:
        note("rendezvous")
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, labels = torch.randn(1024, 32), torch.randint(0, 4, (1024,))
    if args.periodic_only or args.resume_newest:
        periodic_only(args, rank, folder, model, optimizer, inputs, labels)
    else:
        guarded(args, rank, model, optimizer, inputs, labels)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
