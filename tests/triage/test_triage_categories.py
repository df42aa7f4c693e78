"""Per-category verdicts over real-shaped log excerpts and platform signals, hard cases included.

Everything here is the pure core function; no GPU, cluster or network is involved because the
classifier only reads text and wire-form dicts.
"""

from __future__ import annotations

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category

WATCHDOG = (
    "[rank{r}]:[E626 06:24:44.90{r}881913 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, "
    "NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
)
OOM = (
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {mib}.00 MiB. GPU {r} "
    "has a total capacity of 79.15 GiB of which 141.25 MiB is free."
)

LOG_CASES = [
    # (id, log, expected category)
    ("cuda_oom_plain", "step 10 loss 2.3\n" + OOM.format(r=0, mib=336), Category.CUDA_OOM),
    ("cuda_oom_runtime_error",
     "RuntimeError: CUDA out of memory. Tried to allocate 100.00 MiB (GPU 0; 12.00 GiB total",
     Category.CUDA_OOM),
    ("xla_resource_exhausted",
     "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
     "allocate 2.00GiB.", Category.CUDA_OOM),
    ("tf_oom", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
     "allocating tensor with shape[64,512,512]", Category.CUDA_OOM),
    ("host_oom_dataloader", "RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed.",
     Category.HOST_OOM),
    ("host_oom_dmesg", "[1234.5] Out of memory: Killed process 4242 (python) total-vm:9GB",
     Category.HOST_OOM),
    ("host_oom_slurm", "slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of "
     "the step tasks have been OOM Killed.", Category.HOST_OOM),
    ("shm_bus_error", "RuntimeError: DataLoader worker (pid 56811) is killed by signal: Bus error. "
     "It is possible that dataloader's workers are out of shared memory.", Category.SHM_EXHAUSTED),
    ("shm_nccl_segment", "node:1:2 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared "
     "memory segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on device (28)",
     Category.SHM_EXHAUSTED),
    ("shm_semlock", "    sl = self._semlock = _multiprocessing.SemLock(\n"
     "OSError: [Errno 28] No space left on device", Category.SHM_EXHAUSTED),
    ("nccl_watchdog", "\n".join(WATCHDOG.format(r=r) for r in range(3)), Category.NCCL_ERROR),
    ("nccl_remote", "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1333, "
     "remote process exited or there was a network error, NCCL version 2.18.6\n"
     "ncclRemoteError: A call failed possibly due to a network error.\nLast error:\n"
     "socketProgressOpt: Call to recv from 172.1.2.3<33759> failed : Connection reset by peer",
     Category.NCCL_ERROR),
    ("gpu_ecc", "RuntimeError: CUDA error: uncorrectable ECC error encountered", Category.GPU_FAULT),
    ("gpu_xid", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
     Category.GPU_FAULT),
    ("gpu_nvml", "Failed to initialize NVML: Driver/library version mismatch", Category.GPU_FAULT),
    ("transient_dns", "socket.gaierror: [Errno -3] Temporary failure in name resolution",
     Category.TRANSIENT_IO),
    ("transient_hub_503", "huggingface_hub.utils._errors.HfHubHTTPError: 503 Server Error: Service "
     "Temporarily Unavailable for url: https://huggingface.co/x/resolve/main/model.safetensors",
     Category.TRANSIENT_IO),
    ("transient_s3_slowdown", "botocore.exceptions.ClientError: An error occurred (SlowDown) when "
     "calling the GetObject operation: Please reduce your request rate.", Category.TRANSIENT_IO),
    ("transient_dataloader_timeout", "RuntimeError: DataLoader timed out after 1800 seconds",
     Category.TRANSIENT_IO),
    ("checkpoint_zip", "RuntimeError: PytorchStreamReader failed reading zip archive: failed "
     "finding central directory", Category.CHECKPOINT_CORRUPTED),
    ("checkpoint_safetensors", "safetensors_rust.SafetensorError: Error while deserializing "
     "header: MetadataIncompleteBuffer", Category.CHECKPOINT_CORRUPTED),
    ("checkpoint_eof", '  File "train.py", line 14, in load_checkpoint\n'
     "    checkpoint = torch.load(path)\nEOFError: Ran out of input",
     Category.CHECKPOINT_CORRUPTED),
    ("divergence_fpe", "FloatingPointError: Loss became infinite or NaN at iteration=137!",
     Category.DIVERGENCE),
    ("divergence_progress", "iter 15 step 1: loss 2.0308\niter 16 step 1: loss nan\n"
     "iter 17 step 1: loss nan", Category.DIVERGENCE),
    ("code_type_error", "TypeError: forward() got an unexpected keyword argument 'token_type_ids'",
     Category.CODE_ERROR),
    ("code_shapes", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x512 and 256x10)",
     Category.CODE_ERROR),
    ("code_device_assert", "RuntimeError: CUDA error: device-side assert triggered\nCompile with "
     "`TORCH_USE_CUDA_DSA` to enable device-side assertions.", Category.CODE_ERROR),
    ("config_argparse", "usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: "
     "--learning-rate 3e-4", Category.CONFIG_ERROR),
    ("config_driver", "RuntimeError: The NVIDIA driver on your system is too old (found version "
     "10010).", Category.CONFIG_ERROR),
    ("config_kernel_image", "RuntimeError: CUDA error: no kernel image is available for execution "
     "on the device", Category.CONFIG_ERROR),
    ("config_disk_full", "    torch.save(state, path)\nOSError: [Errno 28] No space left on device",
     Category.CONFIG_ERROR),
    ("config_extension_build", "RuntimeError: Error building extension 'fused_adam'",
     Category.CONFIG_ERROR),
    ("data_missing", "FileNotFoundError: [Errno 2] No such file or directory: "
     "'/data/imagenet/train/n01440764'", Category.DATA_ERROR),
    ("data_s3_nosuchkey", "botocore.errorfactory.NoSuchKey: An error occurred (NoSuchKey) when "
     "calling the GetObject operation: The specified key does not exist.", Category.DATA_ERROR),
    ("data_image", "PIL.UnidentifiedImageError: cannot identify image file 'x.jpg'",
     Category.DATA_ERROR),
    ("preempted_slurm", "slurmstepd: error: *** JOB 42 ON node1 CANCELLED AT "
     "2024-01-01T00:00:00 DUE TO PREEMPTION ***", Category.PREEMPTED),
    ("timeout_slurm", "slurmstepd: error: *** STEP 55.0 ON n1 CANCELLED AT 2025-01-10T15:27:25 DUE "
     "TO TIME LIMIT ***\n[rank: 0] Received SIGTERM: 15", Category.TIMEOUT),
    ("user_cancelled_slurm", "slurmstepd: error: *** JOB 71606 ON kilonova CANCELLED AT "
     "2022-03-31T21:25:40 ***", Category.USER_CANCELLED),
    ("node_failure_ray", "The actor died because its node has died. Node Id: b157c93de9",
     Category.NODE_FAILURE),
    ("unschedulable_text", "Warning  FailedScheduling  26m  default-scheduler  0/1 nodes are "
     "available: 1 Insufficient nvidia.com/gpu.", Category.UNSCHEDULABLE),
    ("native_segfault", "epoch 3 step 200 loss 1.2\nFatal Python error: Segmentation fault\n",
     Category.NATIVE_CRASH),
    ("native_torchrun_sigsegv", "E1223 05:18:02.971000 3304089 api.py:882] failed (exitcode: -11) "
     "local_rank: 0 (pid: 3304209) of binary: /usr/bin/python3", Category.NATIVE_CRASH),
]

HARD_CASES = [
    ("oom_root_cause_after_consequences",
     "\n".join(WATCHDOG.format(r=r) for r in (1, 2, 3)) + "\n" + OOM.format(r=0, mib=20),
     Category.CUDA_OOM, 0),
    ("childfailederror_reports_cause_above",
     "[rank1]: ValueError: num_samples should be a positive integer value, but got 0\n"
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
     "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 3309)\n",
     Category.CODE_ERROR, 1),
    ("terminate_called_wrapper_reports_what",
     "terminate called after throwing an instance of 'c10::Error'\n"
     "  what():  CUDA error: unspecified launch failure\nAborted (core dumped)",
     Category.GPU_FAULT, None),
    ("earliest_failing_rank_by_timestamp",
     "2025-06-01T10:00:05.000000000Z stderr F [rank3]: torch.OutOfMemoryError: CUDA out of memory.\n"
     "2025-06-01T10:00:01.000000000Z stderr F [rank1]: RuntimeError: CUDA error: uncorrectable ECC "
     "error encountered",
     Category.GPU_FAULT, 1),
    ("warning_mentions_oom_but_cause_is_code",
     "/x/y.py:12: UserWarning: Warning: CUDA out of memory hint, retrying with smaller chunks\n"
     "KeyError: 'labels'", Category.CODE_ERROR, None),
    ("nccl_warn_does_not_beat_cause",
     "h:1:2 [0] NCCL WARN Net : Connection closed by remote peer\n"
     "AttributeError: 'DistributedDataParallel' object has no attribute 'model'",
     Category.CODE_ERROR, None),
    ("ansi_and_cri_prefixes",
     "2025-06-01T10:00:00.123456789Z stderr F \x1b[31m[rank2]: torch.OutOfMemoryError: CUDA out of "
     "memory.\x1b[0m", Category.CUDA_OOM, 2),
    ("ray_hedge_is_not_an_oom", "ray.exceptions.ActorDiedError: The actor died unexpectedly. There "
     "are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to "
     "high memory usage. (3) The worker is crashed unexpectedly due to SIGSEGV.",
     Category.UNKNOWN, None),
]


@pytest.mark.parametrize("log,expected", [c[1:] for c in LOG_CASES], ids=[c[0] for c in LOG_CASES])
def test_each_category_is_recognised_from_its_log(log: str, expected: Category) -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None
    assert diagnosis.category is expected, diagnosis


@pytest.mark.parametrize("log,expected,rank", [c[1:] for c in HARD_CASES],
                         ids=[c[0] for c in HARD_CASES])
def test_the_root_cause_wins_over_consequences_and_noise(
        log: str, expected: Category, rank: int | None) -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None
    assert diagnosis.category is expected, diagnosis
    if rank is not None:
        assert diagnosis.rank == rank


PLATFORM_CASES = [
    ("oomkilled", triage.Signals(exit_code=137, reason="OOMKilled"), Category.HOST_OOM),
    ("sigkill_without_evidence", triage.Signals(exit_code=137, reason="Error"), Category.UNKNOWN),
    ("segfault_exit", triage.Signals(exit_code=139), Category.NATIVE_CRASH),
    ("torchrun_style_segfault", triage.Signals(exit_code=-11), Category.NATIVE_CRASH),
    ("command_not_found", triage.Signals(exit_code=127), Category.CONFIG_ERROR),
    ("evicted", triage.Signals(exit_code=143, reason="Evicted"), Category.PREEMPTED),
    ("deadline", triage.Signals(reason="DeadlineExceeded"), Category.TIMEOUT),
    ("stalled", triage.Signals(exit_code=143, reason="Stalled"), Category.TIMEOUT),
    ("cancelled", triage.Signals(exit_code=143, reason="Cancelled"), Category.USER_CANCELLED),
    ("image_pull", triage.Signals(reason="ImagePullBackOff"), Category.CONFIG_ERROR),
    ("disruption_preemption", triage.Signals(exit_code=143, conditions=(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},)),
     Category.PREEMPTED),
    ("disruption_taint_manager", triage.Signals(exit_code=143, conditions=(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},)),
     Category.NODE_FAILURE),
    ("event_objects", triage.Signals(events=({
        "reason": "FailedScheduling", "type": "Warning",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."},)),
     Category.UNSCHEDULABLE),
    ("kubectl_events_text", triage.Signals(events=(
        "LAST SEEN   TYPE      REASON         OBJECT        MESSAGE\n"
        "2m          Warning   NodeNotReady   pod/train-0   Node is not ready\n")),
     Category.NODE_FAILURE),
    ("oomkilled_beats_the_log", triage.Signals(
        exit_code=137, reason="OOMKilled", log=OOM.format(r=0, mib=20)), Category.HOST_OOM),
]


@pytest.mark.parametrize("signals,expected", [c[1:] for c in PLATFORM_CASES],
                         ids=[c[0] for c in PLATFORM_CASES])
def test_platform_signals_decide_without_a_log(signals: triage.Signals, expected: Category) -> None:
    diagnosis = triage.classify(signals)
    assert diagnosis is not None
    assert diagnosis.category is expected, diagnosis
    if signals.log is None:
        assert diagnosis.line_number is None


def test_exit_zero_with_only_warnings_is_not_a_failure() -> None:
    log = ("/opt/x.py:391: FutureWarning: This implementation of AdamW is deprecated\n"
           "h:1:2 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n"
           "Warning: CUDA out of memory hint: falling back to smaller chunks\n")
    assert triage.classify(triage.Signals(exit_code=0, log=log)) is None


def test_exit_zero_with_a_platform_verdict_is_still_a_failure() -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=0, reason="DeadlineExceeded"))
    assert diagnosis is not None and diagnosis.category is Category.TIMEOUT


def test_an_empty_log_with_a_failing_exit_is_unknown_and_retryable_once() -> None:
    first = triage.classify(triage.Signals(exit_code=1, log=b""))
    assert first is not None
    assert (first.category, first.rule_id, first.retryable) == (
        Category.UNKNOWN, "fallback.unknown", True)
    second = triage.classify(triage.Signals(exit_code=1, log=b""), previous=[first])
    assert second is not None and second.retryable is False
    assert triage.classify(triage.Signals(exit_code=0, log=b"")) is None


def test_a_repeated_native_crash_is_not_retried_again() -> None:
    log = "epoch 1 step 5\nSegmentation fault (core dumped)\n"
    first = triage.classify(triage.Signals(exit_code=139, log=log))
    assert first is not None and first.category is Category.NATIVE_CRASH and first.retryable
    again = triage.classify(triage.Signals(exit_code=139, log="epoch 9 step 77\n" + log),
                            previous=[first])
    assert again is not None and again.retryable is False
    other = triage.classify(triage.Signals(exit_code=139, log="double free or corruption (out)"),
                            previous=[first])
    assert other is not None and other.retryable is True


def test_the_diagnosis_names_the_deciding_line_and_serialises_to_json_types() -> None:
    log = "step 1\nstep 2\n" + OOM.format(r=4, mib=20) + "\n"
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None
    assert diagnosis.line_number == 3 and diagnosis.rank == 4
    assert diagnosis.signature.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    data = diagnosis.to_dict()
    assert data["category"] == "cuda_oom" and data["rule_id"] == "cuda_oom.torch"
    assert set(data) >= {"category", "retryable", "rule_id", "signature", "fingerprint",
                         "line_number", "rank", "remediation"}
