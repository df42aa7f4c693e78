"""The guard as a Lightning callback: ``pl.Trainer(callbacks=[GuardCallback(every_n_steps=10)])``.

It replaces Lightning's own SIGTERM handler for the time of ``fit`` (that one broadcasts from inside
the signal handler and ends the run without a checkpoint) with the guard's: at the end of a training
batch that completed an optimizer step the ranks agree on a notice, rank 0 saves the full Lightning
checkpoint (``step-NNNNNN.ckpt``, which ``fit(ckpt_path=...)`` resumes) atomically with its
acknowledgement, and every rank stops with 128 + the signal. When a peer dies, `on_exception` saves a
just-in-time checkpoint from one survivor, without the barrier Lightning's own exception
checkpointing would wait on forever.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

try:
    import pytorch_lightning as pl
except ImportError:  # the unified package
    import lightning.pytorch as pl  # type: ignore[no-redef]

from trainguard_train.guard import Guard, peer_lost


class GuardCallback(pl.Callback):
    """Notice checkpoints, periodic checkpoints every ``every_n_steps`` and just-in-time checkpoints."""

    def __init__(self, every_n_steps: int | None = None, checkpoint_dir: str | os.PathLike[str] | None = None,
                 agree_every: int | None = None) -> None:
        self.every_n_steps, self.checkpoint_dir, self.agree_every = every_n_steps, checkpoint_dir, agree_every
        self.guard: Guard | None = None
        self._trainer: pl.Trainer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        guard = Guard(pl_module, save=self._save, every=self.every_n_steps, checkpoint_dir=self.checkpoint_dir,
                      name="step-{step:06d}.ckpt", agree_every=self.agree_every)
        guard.completed = guard.resumed_from = trainer.global_step
        guard.install()
        self.guard = guard

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.guard is not None and trainer.global_step != self.guard.completed:
            self.guard.step_done(trainer.global_step)  # an optimizer step returned (not an accumulation batch)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.guard is not None and peer_lost(exception):
            self.guard.just_in_time(exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.guard is not None:
            self.guard.uninstall()

    def _save(self, step: int, path: Path) -> None:
        """The full Lightning checkpoint, written by this rank alone (no barrier: a peer may be dead)."""
        trainer = self._trainer
        assert trainer is not None
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, path)
