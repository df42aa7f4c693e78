"""A tiny Lightning run (DDP over gloo on the CPU, ModelCheckpoint every epoch) that fails.

Run under torchrun with ``--fault shape`` (rank ``--fault-rank`` feeds the model a batch of the
wrong width in its second epoch, after a checkpoint was saved) or ``--fault checkpoint`` (the run
resumes from a checkpoint that was cut off mid-write). The errors are Lightning's and PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self, fault: str, fault_rank: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)
        self.fault = fault
        self.fault_rank = fault_rank

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        if (self.fault == "shape" and self.global_rank == self.fault_rank
                and self.current_epoch == 1 and index == 1):
            x = x[:, :12]  # a batch from a differently configured pipeline
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=("shape", "checkpoint"), default="shape")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,))),
                      batch_size=8)
    checkpoints = ModelCheckpoint(dirpath=workdir / "checkpoints", save_last=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")), strategy="ddp",
        max_epochs=3, callbacks=[checkpoints], logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=workdir)
    resume_from = None
    if args.fault == "checkpoint":
        resume_from = workdir / "checkpoints" / "last.ckpt"
        if int(os.environ.get("RANK", "0")) == 0:
            first = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                               callbacks=[ModelCheckpoint(dirpath=workdir / "checkpoints",
                                                          save_last=True)],
                               enable_progress_bar=False, enable_model_summary=False,
                               default_root_dir=workdir)
            first.fit(Tiny("none", -1), data)
            blob = resume_from.read_bytes()
            resume_from.write_bytes(blob[: len(blob) // 3])  # the node died mid-write
    trainer.fit(Tiny(args.fault, args.fault_rank), data, ckpt_path=resume_from)


if __name__ == "__main__":
    main()
