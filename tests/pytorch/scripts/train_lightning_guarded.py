"""A Lightning run with trainguard's callback; ``--kill-rank R --kill-step S`` SIGKILLs rank R in step S
(1-based) of the first attempt, before its gradients are all-reduced."""

from __future__ import annotations

import argparse
import os
import signal
import time

import pytorch_lightning as pl
import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, TensorDataset
from trainguard_train.lightning import GuardCallback


class Classifier(pl.LightningModule):
    def __init__(self, kill_rank: int, kill_step: int, step_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.kill_rank, self.kill_step, self.step_seconds = kill_rank, kill_step, step_seconds
        self.attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "1"))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        if self.global_step + 1 == self.kill_step and self.global_rank == self.kill_rank and self.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        time.sleep(self.step_seconds)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_train_start(self) -> None:
        print(f"rank {self.global_rank} starts at step {self.global_step}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    args = parser.parse_args()
    torch.manual_seed(1234)
    data = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,))), batch_size=32)
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), strategy="ddp",
        max_epochs=args.epochs, callbacks=[GuardCallback(every_n_steps=5)], logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(Classifier(args.kill_rank, args.kill_step, args.step_seconds), data,
                ckpt_path=os.environ.get("TRAINGUARD_RESUME_FROM") or None)


if __name__ == "__main__":
    main()
