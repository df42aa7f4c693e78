"""The failure taxonomy: category ids, their default retry decision and a remediation hint.

The ids are a contract shared by the classifier, the CLI's JSON, Prefect events, reports and the
evaluation corpora; never rename one. What decides *which* category a failure is belongs in
``triage``; what a user's policy does with the category belongs in ``policy``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Category(str, enum.Enum):
    """One failure category; the value is the taxonomy id."""

    CODE_ERROR = "code_error"
    CONFIG_ERROR = "config_error"
    DATA_ERROR = "data_error"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    SHM_EXHAUSTED = "shm_exhausted"
    NCCL_ERROR = "nccl_error"
    GPU_FAULT = "gpu_fault"
    TRANSIENT_IO = "transient_io"
    CHECKPOINT_CORRUPTED = "checkpoint_corrupted"
    DIVERGENCE = "divergence"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node_failure"
    UNSCHEDULABLE = "unschedulable"
    TIMEOUT = "timeout"
    HANG = "hang"
    DESYNC = "desync"
    NATIVE_CRASH = "native_crash"
    USER_CANCELLED = "user_cancelled"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CategoryInfo:
    """What the taxonomy says of one category by default."""

    retryable: bool
    avoid_node: bool
    remediation: str


INFO: dict[Category, CategoryInfo] = {
    Category.CODE_ERROR: CategoryInfo(
        False, False, "Fix the training code; the traceback's last frame is the place to start."
    ),
    Category.CONFIG_ERROR: CategoryInfo(
        False, False, "Fix the run's configuration, image or environment; retrying cannot help."
    ),
    Category.DATA_ERROR: CategoryInfo(
        False, False, "Check the dataset path, bucket and record format the run reads."
    ),
    Category.CUDA_OOM: CategoryInfo(
        False,
        False,
        "Lower the batch size, enable activation checkpointing or mixed precision, or set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ),
    Category.HOST_OOM: CategoryInfo(
        False, False, "Raise the container memory limit or lower DataLoader workers/prefetch."
    ),
    Category.SHM_EXHAUSTED: CategoryInfo(
        False, False, "Mount a larger /dev/shm (emptyDir medium: Memory) or lower num_workers."
    ),
    Category.NCCL_ERROR: CategoryInfo(
        True, False, "Retry; if it repeats, check the interconnect and NCCL_DEBUG=INFO output."
    ),
    Category.GPU_FAULT: CategoryInfo(
        True, True, "Retry on another node and report the node's GPU to the cluster operators."
    ),
    Category.TRANSIENT_IO: CategoryInfo(
        True, False, "Retry; add client-side retries around storage and hub access."
    ),
    Category.CHECKPOINT_CORRUPTED: CategoryInfo(
        True, False, "Resume from the checkpoint before the newest; write checkpoints atomically."
    ),
    Category.DIVERGENCE: CategoryInfo(
        False, False, "Lower the learning rate, add gradient clipping, or check the data batch."
    ),
    Category.PREEMPTED: CategoryInfo(
        True, False, "Retry from the last checkpoint; checkpoint more often on spot capacity."
    ),
    Category.NODE_FAILURE: CategoryInfo(
        True, True, "Retry on another node; the node's events say what happened to it."
    ),
    Category.UNSCHEDULABLE: CategoryInfo(
        True, False, "Wait for capacity, or request fewer GPUs; check quotas."
    ),
    Category.TIMEOUT: CategoryInfo(
        True, False, "Retry; if it hangs again, look for a stuck collective or data loader."
    ),
    Category.HANG: CategoryInfo(
        True, False, "Retry once; the stacks name the rank that was elsewhere and its frame: fix what it waited on."
    ),
    Category.DESYNC: CategoryInfo(
        False, False, "The ranks called different collectives: a code path that differs by rank; read the stacks."
    ),
    Category.NATIVE_CRASH: CategoryInfo(
        True, False, "Retry once; open the kept core dump with gdb (or cuda-gdb) if it repeats."
    ),
    Category.USER_CANCELLED: CategoryInfo(False, False, "Stopped on purpose; nothing to fix."),
    Category.UNKNOWN: CategoryInfo(
        True, False, "Retry once; read the evidence and add a rule if it repeats."
    ),
}


def parse(value: str) -> Category:
    """Return the category for a taxonomy id, with an error that lists the valid ids."""
    try:
        return Category(value)
    except ValueError:
        valid = ", ".join(c.value for c in Category)
        raise ValueError(f"unknown failure category {value!r}; expected one of: {valid}") from None
