"""Every name inside one attempt's folder, on both sides of the container line.

The entrypoint fills the folder inside the training container (a local process, a pod, a Slurm
task); trainguard's runners and supervisors write beside it; evidence collection, triage and
recovery read it. All of them take the names from here, as submitit's ``JobPaths`` serves both
the submitting side and the job itself, so a file is renamed in one place. The core re-exports
this module (``trainguard.core.backends.workspace``), which also owns where the folder lies under
a work root and the run's shared checkpoint folder. Reading or writing the files does not belong
here: only names and the paths they make.

The folder of a multi-node attempt's node N > 0 is ``tasks/N`` inside node 0's (the attempt's
own); each node's folder holds the same names.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

# What the entrypoint writes.
LOGS = "logs"  # the command's output, teed (`log_name`)
COREDUMPS = "coredumps"  # core files moved here after a crash
SNAPSHOT = "snapshot"  # environment, host and GPU state before and after the command
ENV_SNAPSHOT, HOST_SNAPSHOT = "env.json", "host.json"  # in `SNAPSHOT`
GPU_BEFORE, GPU_AFTER = "gpu-before", "gpu-after"  # folders in `SNAPSHOT`, each with its `INDEX`
INDEX = "index.json"  # what a folder of captures holds, or why a capture is absent (gpu-*, stacks)
CRASH_REPORT = "crash-report.json"  # how the command ended
PROGRESS_RECORD = "progress.json"  # the last sign of progress the entrypoint saw in the logs
STACKS = "stacks"  # the ranks' stacks when asked or before a stop, with its `INDEX`
STACKS_SITE = "site"  # in `STACKS`: the faulthandler `sitecustomize` the ranks load, and their pids
DUMP_REQUEST = "dump-stacks"  # a file whose appearance asks the entrypoint for the ranks' stacks
FLIGHT_RECORDER = "flight-recorder"  # PyTorch's flight-recorder traces and trigger pipes
NOTICE_FILE = "notice.json"  # a stop with warning, for the training command (`TRAINGUARD_NOTICE_FILE`)
NODE_FOLDERS = "tasks"  # node N > 0 keeps its folder at `tasks/N`
HELPER_ARCHIVE = "site/trainguard-train.zip"  # the training-side helper, zipped for a command run from a source tree

# What torchrun writes where trainguard points it (`torchrun_env`).
RANKS = "ranks"  # each rank's log and error file: ranks/<run>/attempt_<n>/<local rank>/
TORCHELASTIC = "torchelastic"  # the agent's root-cause error file
TORCHELASTIC_ERROR = "error.json"  # the name of every torchrun error file, the agent's and each rank's

# What trainguard's own side writes in the folder.
PROCESS_RECORD = "process.json"  # which process runs the attempt (the local runner)
RUNNER_REPORT = "runner.json"  # the runner's or supervisor's account of how the attempt ended
SLURM_JOB_RECORD = "slurm-job.json"  # which Slurm job the attempt follows, and who follows it
SLURM_BATCH_SCRIPT = "slurm-batch.sh"  # the batch script submitted
SLURM_SIGNAL_MARKER = "slurm-signal.txt"  # the batch shell notes here when Slurm warned it (--signal)
SLURM_KEPT = "slurm"  # what Slurm said of the job and its nodes, as trainguard kept it
SLURM_JOB_SHOWN = "scontrol-show-job.txt"  # in `SLURM_KEPT`: the job as `scontrol show job` last described it

# What trainguard keeps of a Kubernetes attempt on its own machine, in a folder of the same layout.
TRIAGE_FACTS = "triage.json"  # the cluster facts triage reads
KEPT_LOG = "attempt.log"  # the training log as collected (masked)
KEPT_VOLUME, KEPT_PODS = "volume", "pods"  # the attempt folder copied from its volume; each pod's log
KEPT_NODE_MAP = "attempt.json"  # which pod ran which node, and the evidence of each

# Entries written while the training runs, as the entrypoint lays them out; `EXPECTED_SNAPSHOTS`
# are the snapshot files a finished attempt should have.
EXPECTED_SNAPSHOTS = (
    f"{SNAPSHOT}/{ENV_SNAPSHOT}", f"{SNAPSHOT}/{HOST_SNAPSHOT}", f"{SNAPSHOT}/{GPU_BEFORE}/{INDEX}",
    f"{SNAPSHOT}/{GPU_AFTER}/{INDEX}",
)


def log_name(run_id: str, attempt: int) -> str:
    """The training log's file name in `LOGS`: ``train-{run id}-attempt-{n}.log``.

    The caller has checked ``run_id`` and ``attempt`` (the entrypoint's options, the core's ids).
    """
    return f"train-{run_id}-attempt-{attempt}.log"


def slurm_output(job_id: str, stream: str) -> str:
    """The job's own stdout (``stream`` "out") or stderr ("err") as `sbatch` writes it: ``slurm-{id}.{stream}``."""
    return f"slurm-{job_id}.{stream}"


def node_prefix(index: int) -> str:
    """Where node ``index``'s files lie relative to the attempt's folder: "" for node 0, ``tasks/N/`` else."""
    return "" if index == 0 else f"{NODE_FOLDERS}/{index}/"


def torchrun_env(workspace: str) -> dict[str, str]:
    """Where torchrun keeps each rank's log (`PET_LOG_DIR`, teed: `PET_TEE=3`) and its root-cause error
    (`TORCHELASTIC_ERROR_FILE`), in the attempt's folder as the container sees it (``workspace``)."""
    return {"PET_LOG_DIR": posixpath.join(workspace, RANKS), "PET_TEE": "3",
            "TORCHELASTIC_ERROR_FILE": posixpath.join(workspace, TORCHELASTIC, TORCHELASTIC_ERROR)}


@dataclass(frozen=True)
class AttemptPaths:
    """The paths inside one node's attempt folder, as the entrypoint fills it (node 0's is the attempt's own).

    Attributes:
        folder: The node's folder (for node N > 0, ``tasks/N`` inside the attempt's).
    """

    folder: Path

    def node(self, index: int) -> AttemptPaths:
        """Node ``index``'s paths, when ``self`` is the attempt's own folder (node 0's)."""
        return AttemptPaths(self.folder / node_prefix(index)) if index else self

    def log(self, run_id: str, attempt: int) -> Path:
        """The training log the entrypoint tees the command's output to, unless told another."""
        return self.folder / LOGS / log_name(run_id, attempt)

    @property
    def notice(self) -> Path:
        """Where notice of a stop is given to this node's training command (`TRAINGUARD_NOTICE_FILE`)."""
        return self.folder / NOTICE_FILE
