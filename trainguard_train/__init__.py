"""trainguard's training-side helper: a failure or a stop with warning costs one step, not an hour.

Imported by the training script (stdlib and torch only; trainguard puts it on the training's Python
path on every backend). A plain DDP loop::

    import trainguard_train as tg

    with tg.Guard(ddp_model, optimizer, every=10) as guard:
        for step in guard.steps(guard.resume(), total_steps):
            ...  # forward, backward, optimizer.step()

An FSDP2 or HSDP model (``fully_shard``) is passed the same way: the default save writes a folder of
shards (`trainguard_train.shards`), and with HSDP the survivors of a dead rank save a whole replica.
A loop that owns its checkpoint code passes ``save=lambda step, path: ...`` (and ``load=``) and, if it
does not iterate `Guard.steps`, calls ``guard.step_done(steps_completed)`` after each optimizer step.
Lightning: ``trainer = pl.Trainer(callbacks=[trainguard_train.lightning.GuardCallback(every_n_steps=10)])``.
"""

from __future__ import annotations

from trainguard_train.guard import Guard, Stopped, peer_lost

__all__ = ["Guard", "Stopped", "peer_lost"]
