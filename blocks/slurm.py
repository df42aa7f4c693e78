"""The Slurm backend block: where on an HPC cluster training attempts run. Configuration only.

Its `backend()` factory builds `trainguard.core.backends.slurm.backend.SlurmBackend`; flows load it by
reference (`trainguard-slurm-backend/<name>`) like any other backend block.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from prefect.blocks.core import Block
from pydantic import Field

from blocks import jobfields
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.slurm.backend import SlurmBackend as SlurmAdapter
from trainguard.core.backends.slurm.job import JobSettings


class SlurmBackend(Block):
    """Runs each training attempt as a Slurm batch job; the flow follows it and keeps its evidence."""

    _block_type_name = "trainguard Slurm Backend"
    _block_type_slug = "trainguard-slurm-backend"
    _description = (
        "Run training attempts as Slurm batch jobs (sbatch --no-requeue), with workspaces and checkpoints "
        "on the cluster's shared filesystem."
    )

    shared_folder: str = Field(
        title="Shared folder",
        description="A folder on the cluster's shared filesystem, mounted at the same path on the compute nodes "
        "and where the flow runs: attempt workspaces, checkpoints and the entrypoint archive go here.",
    )
    partition: str | None = Field(default=None, title="Partition", description="sbatch --partition; the default partition when empty.")
    account: str | None = Field(default=None, title="Account", description="sbatch --account, the account charged.")
    qos: str | None = Field(default=None, title="QoS", description="sbatch --qos.")
    gpu_option: Literal["gpus", "gres"] = Field(
        default="gpus", title="GPU request",
        description="'gpus' asks with --gpus=N for the whole job; 'gres' with --gres=gpu:N per node (older sites).",
    )
    gpu_type: str | None = Field(default=None, title="GPU type", description="e.g. 'a100' (--gpus=a100:8); any type when empty.")
    gpus_per_node: int | None = Field(
        default=None, ge=0, title="GPUs per node",
        description="GPUs each node holds; when empty, the run spec's gpus spread over the nodes.",
    )
    nodes: int = Field(default=1, ge=1, title="Nodes", description="sbatch --nodes.")
    ntasks_per_node: int = Field(
        default=1, ge=1, title="Tasks per node",
        description="sbatch --ntasks-per-node: srun starts the entrypoint and the command once per task.",
    )
    cpus_per_task: int | None = Field(default=None, ge=1, title="CPUs per task", description="sbatch --cpus-per-task.")
    memory_mb: int | None = Field(
        default=None, ge=1, title="Memory per node (MB)",
        description="sbatch --mem; raised by the retry policy's memory factor after a host OOM. Site default when empty.",
    )
    signal_lead_seconds: int = Field(
        default=120, ge=0, title="Warning before the time limit (s)",
        description="sbatch --signal=B:TERM@N: how long before the time limit (from the spec's deadline) the job "
        "is given notice (the training saves a checkpoint, the entrypoint writes its report), unless the spec's "
        "notice_grace_seconds sets it. Slurm may send it up to a minute early. 0 = no warning.",
    )
    extra_sbatch_options: list[str] = Field(
        default_factory=list, title="Extra sbatch options",
        description="More options, one per entry, e.g. '--constraint=a100' or '--reservation=big'.",
    )
    python: str | None = Field(
        default=None, title="Python on the nodes",
        description="Interpreter on the compute nodes that runs the entrypoint; defaults to the flow's own.",
    )
    slurm_conf: str | None = Field(
        default=None, title="slurm.conf",
        description="Path of the cluster's slurm.conf (SLURM_CONF) when it is not the system's.",
    )
    poll_max_seconds: float = Field(
        default=2.0, gt=0, title="Longest poll interval (s)",
        description="squeue is asked about the job at most this far apart (it backs off up to here).",
    )

    command_timeout_seconds: float = Field(
        default=30.0, gt=0, title="Command timeout (s)",
        description="A Slurm command (squeue, sbatch, scontrol, sacct) that has not answered by then counts as failed.",
    )
    controller_timeout_seconds: float = Field(
        default=300.0, gt=0, title="Controller silence allowed (s)",
        description="How long slurmctld may go unanswered while a job is followed before the attempt ends as "
        "ControllerUnreachable, with the evidence it can still collect (the job may run on and be adopted later).",
    )

    evidence_budget_bytes: int = jobfields.evidence_budget("logs of every task, reports, snapshots, the job's stdout and stderr, "
                                                            "the newest checkpoint, core dumps", "on the shared folder")
    core_dump_budget_bytes: int = jobfields.core_dump_budget("on the shared folder")
    log_budget_bytes: int = jobfields.log_budget("on the shared folder")

    stack_sweep_seconds: float = jobfields.stack_sweep("a hung or stalled job is cancelled (the cancel waits for it)")
    native_stacks: bool = jobfields.native_stacks()
    checkpoint_verify_seconds: float = jobfields.checkpoint_verify("trainguard (on the shared folder)")

    def backend(self) -> SlurmAdapter:
        """The Slurm adapter this block describes."""
        env = {**os.environ, "SLURM_CONF": self.slurm_conf} if self.slurm_conf else None
        settings = JobSettings(
            partition=self.partition, account=self.account, qos=self.qos, gpu_option=self.gpu_option,
            gpu_type=self.gpu_type, gpus_per_node=self.gpus_per_node, nodes=self.nodes,
            ntasks_per_node=self.ntasks_per_node, cpus_per_task=self.cpus_per_task, memory_mb=self.memory_mb,
            signal_lead_seconds=self.signal_lead_seconds, extra_options=tuple(self.extra_sbatch_options),
        )
        settings.check()
        return SlurmAdapter(
            shared_folder=Path(self.shared_folder).expanduser().resolve(), settings=settings,
            python=self.python or sys.executable, client=SlurmClient(env=env, timeout_seconds=self.command_timeout_seconds),
            poll_max_seconds=self.poll_max_seconds, controller_timeout_seconds=self.controller_timeout_seconds,
            budget=Budget(total_bytes=self.evidence_budget_bytes, core_dump_bytes=self.core_dump_budget_bytes,
                          log_bytes=self.log_budget_bytes),
            capture=StackCapture(self.stack_sweep_seconds, self.native_stacks),
            checkpoint_verify_seconds=self.checkpoint_verify_seconds,
        )
