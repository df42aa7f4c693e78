"""A Lightning training script that trainguard can retry from its last checkpoint.

Under torchrun (`command: [torchrun, examples/lightning/train.py]`) Lightning finds the ranks
torchrun started; trainguard's rendezvous variables make the same spec run on one node or many.
`ModelCheckpoint` writes into `TRAINGUARD_CHECKPOINT_DIR` (every attempt of the run shares it;
Lightning saves atomically), and `fit(ckpt_path=...)` resumes from the checkpoint trainguard
names in `TRAINGUARD_RESUME_FROM` on a retry (`epoch=3-step=120.ckpt`, or `last.ckpt`).
trainguard's `GuardCallback` adds what makes a failure cost one step: on a notice (SIGTERM, Ctrl-C,
an eviction) the ranks agree on a step and rank 0 saves it before the deadline; when a rank dies,
a survivor saves the last completed step (`step-NNNNNN.ckpt`, acknowledged in `.trainguard-acks/`).
"""

from __future__ import annotations

import argparse
import os
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, TensorDataset
from trainguard_train.lightning import GuardCallback


class Classifier(pl.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.step_seconds = step_seconds

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=False)
        if self.global_rank == 0:
            print(f"step {self.global_step + 1} loss {loss.item():.4f}", flush=True)
        time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@record
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(1234)
    data = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,))), batch_size=32)
    checkpoints = ModelCheckpoint(dirpath=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "checkpoints"),
                                  save_last=True, every_n_epochs=1, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="auto", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("NNODES", "1")), strategy="ddp", max_epochs=args.epochs,
        callbacks=[checkpoints, GuardCallback()], logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Classifier(args.step_seconds), data, ckpt_path=os.environ.get("TRAINGUARD_RESUME_FROM") or None)


if __name__ == "__main__":
    main()
