"""Failure families whose wording alone misleads: scheduler verdicts, hypotheses, and context.

Each case pins one general rule of the triage engine (not one excerpt): LSF's termination reason
keywords, srun tearing a step down after a task failed, cloud quotas that print
RESOURCE_EXHAUSTED, lists of what *can* kill a node, an unreadable HDF5 file that is a
checkpoint only when a model is being loaded. Every case runs on both scan engines, because the
Hyperscan prefilter and the ``re`` fallback must agree. The excerpts are text only: no GPU,
scheduler or cluster is involved.
"""

from __future__ import annotations

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category

ENGINES = ["re", pytest.param("hyperscan", marks=pytest.mark.skipif(
    not triage.hyperscan_available(), reason="hyperscan is not importable here"))]

LSF_SUMMARY = (
    "------------------------------------------------------------\n"
    "# LSBATCH: User input\n./train.sh\n"
    "------------------------------------------------------------\n\n"
    "{reason}\nExited with exit code {code}.\n\nResource usage summary:\n\n"
    "    CPU time :                                   5.69 sec.\n"
)
SRUN_TEARDOWN = (
    "srun: error: node17: task 3: {task}\n"
    "srun: Terminating StepId=440575.0\n"
    "slurmstepd: error: *** STEP 440575.0 ON node17 CANCELLED AT 2023-12-05T07:16:01 ***\n"
)
H5_FRAMES = (
    '  File "h5py/_objects.pyx", line 55, in h5py._objects.with_phil.wrapper\n'
    '  File "h5py/h5f.pyx", line 106, in h5py.h5f.open\n'
    "OSError: Unable to open file (file signature not found)\n"
)

CASES = [
    # (id, signals, expected category)
    ("lsf_run_limit_is_a_timeout", triage.Signals(log=LSF_SUMMARY.format(
        reason="TERM_RUNLIMIT: job killed after reaching LSF run time limit.", code=140)),
     Category.TIMEOUT),
    ("lsf_memory_limit_is_host_oom", triage.Signals(log=LSF_SUMMARY.format(
        reason="TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.", code=137)),
     Category.HOST_OOM),
    ("lsf_owner_kill_is_a_person", triage.Signals(log=LSF_SUMMARY.format(
        reason="TERM_OWNER: job killed by owner.", code=130)), Category.USER_CANCELLED),
    ("lsf_preemption", triage.Signals(log=LSF_SUMMARY.format(
        reason="TERM_PREEMPT: job killed after preemption.", code=143)), Category.PREEMPTED),
    ("srun_teardown_after_oom_kill_is_the_oom", triage.Signals(log=(
        "slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step "
        "tasks have been OOM Killed.\n" + SRUN_TEARDOWN.format(task="Out Of Memory"))),
     Category.HOST_OOM),
    ("srun_teardown_after_a_traceback_is_the_traceback", triage.Signals(log=(
        "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
        "TypeError: forward() missing 1 required positional argument: 'x'\n"
        + SRUN_TEARDOWN.format(task="Exited with exit code 1"))), Category.CODE_ERROR),
    ("a_bare_step_cancellation_alone_is_still_a_person", triage.Signals(log=(
        "srun: got SIGCONT\n"
        "slurmstepd: error: *** STEP 3.0 ON c1 CANCELLED AT 2025-02-13T15:47:35 ***\n")),
     Category.USER_CANCELLED),
    ("a_cloud_gpu_quota_is_unschedulable_not_device_memory", triage.Signals(exit_code=1, log=(
        '"error": {\n    "code": 429,\n    "message": "The following quota metrics exceed quota '
        'limits: aiplatform.googleapis.com/custom_model_training_nvidia_a100_gpus",\n'
        '    "status": "RESOURCE_EXHAUSTED"\n  }\n')), Category.UNSCHEDULABLE),
    ("an_api_rate_quota_is_not_a_gpu_quota", triage.Signals(exit_code=1, log=(
        "google.api_core.exceptions.TooManyRequests: 429 Quota exceeded for quota metric "
        "'Read requests' and limit 'Read requests per minute'\n")), Category.TRANSIENT_IO),
    ("a_list_of_possible_node_deaths_is_no_preemption_notice", triage.Signals(exit_code=1, log=(
        "Task failed because the node it was running on is dead or unavailable. This can "
        "happen if the node was preempted, had a hardware failure, or its raylet crashed.\n")),
     Category.NODE_FAILURE),
    ("a_real_preemption_notice_still_counts", triage.Signals(exit_code=1, log=(
        "The actor died because its node has died.\n"
        "\tthe actor's node was preempted: node drain\n")), Category.PREEMPTED),
    ("an_unreadable_hdf5_while_loading_a_model_is_a_checkpoint", triage.Signals(exit_code=1, log=(
        '  File "train.py", line 40, in <module>\n    model.load_weights("weights.h5")\n'
        + H5_FRAMES)), Category.CHECKPOINT_CORRUPTED),
    ("an_unreadable_hdf5_in_a_data_loader_is_input_data", triage.Signals(exit_code=1, log=(
        '  File "data/mri_data.py", line 49, in __init__\n    data = h5py.File(fname, "r")\n'
        + H5_FRAMES)), Category.DATA_ERROR),
    ("torchrun_forwarding_sigint_is_a_person", triage.Signals(exit_code=1, log=(
        "WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting "
        "down workers\nWARNING:torch.distributed.elastic.multiprocessing.api:Sending process "
        "4797 closing signal SIGINT\n")), Category.USER_CANCELLED),
    ("torchrun_forwarding_sigterm_hints_at_the_platform", triage.Signals(exit_code=1, log=(
        "W0409 07:28:49.530000 1359 torch/distributed/elastic/agent/server/api.py:719] Received "
        "15 death signal, shutting down workers\n")), Category.PREEMPTED),
    ("admission_refused_for_a_lost_gpu_is_a_gpu_fault", triage.Signals(
        reason="UnexpectedAdmissionError", log=(
            "Message: Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed "
            "with err: error creating nvml.Device 5: nvml: GPU is lost, which is unexpected\n")),
     Category.GPU_FAULT),
    ("admission_refused_for_lack_of_devices_is_unschedulable", triage.Signals(
        reason="UnexpectedAdmissionError"), Category.UNSCHEDULABLE),
    ("a_container_that_cannot_start_for_a_missing_driver_is_a_gpu_fault", triage.Signals(
        exit_code=128, reason="ContainerCannotRun", log=(
            "failed to create shim task: OCI runtime create failed: runc create failed: unable to "
            "start container process: error running hook #0: exit status 1\n"
            "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown\n")),
     Category.GPU_FAULT),
    ("a_container_that_cannot_start_alone_is_configuration", triage.Signals(
        exit_code=128, reason="ContainerCannotRun"), Category.CONFIG_ERROR),
    ("exit_130_is_an_interrupt", triage.Signals(exit_code=130), Category.USER_CANCELLED),
    ("exit_124_is_the_timeout_command", triage.Signals(exit_code=124), Category.TIMEOUT),
    ("a_ray_worker_prefix_does_not_hide_the_exception", triage.Signals(exit_code=1, log=(
        "(RayTrainWorker pid=4183, ip=10.0.1.5) Traceback (most recent call last):\n"
        "(RayTrainWorker pid=4183, ip=10.0.1.5)     out = model(x, mask=m)\n"
        "(RayTrainWorker pid=4183, ip=10.0.1.5) TypeError: forward() got an unexpected keyword "
        "argument 'mask'\n"
        "ray.exceptions.RayTaskError(TypeError): ray::_RayTrainWorker__execute.get_next() "
        "(pid=4183, ip=10.0.1.5)\n")), Category.CODE_ERROR),
    ("a_skewed_clock_is_the_environment", triage.Signals(exit_code=1, log=(
        "botocore.exceptions.ClientError: An error occurred (RequestTimeTooSkewed) when calling "
        "the PutObject operation: The difference between the request time and the server's "
        "time is too large.\n")), Category.CONFIG_ERROR),
    ("fp16_without_a_gpu_is_configuration_not_code", triage.Signals(exit_code=1, log=(
        "ValueError: fp16 mixed precision requires a GPU\n")), Category.CONFIG_ERROR),
    ("a_raise_line_in_a_traceback_is_not_the_error", triage.Signals(exit_code=1, log=(
        "    raise SSLError(e, request=request)\n"
        "requests.exceptions.SSLError: HTTPSConnectionPool(host='huggingface.co', port=443): "
        "Max retries exceeded (Caused by SSLError(SSLCertVerificationError(1, '[SSL: "
        "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer "
        "certificate')))\n")), Category.CONFIG_ERROR),
    ("a_quoted_raise_of_unpicklingerror_is_not_a_corrupt_checkpoint", triage.Signals(
        exit_code=1, log=(
            '  File "torch/serialization.py", line 1470, in load\n'
            "    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None\n"
            "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, "
            "to do so you have two options.\n")), Category.CONFIG_ERROR),
    ("rich_traceback_source_boxes_are_not_evidence", triage.Signals(exit_code=1, log=(
        "│ ❱ 1470 │   │   │   raise pickle.UnpicklingError(_get_wo_message(str(e))) from None │\n"
        "UnpicklingError: Weights only load failed.\n")), Category.CONFIG_ERROR),
    ("a_google_api_deadline_is_transient_not_the_pod_deadline", triage.Signals(exit_code=1, log=(
        "google.api_core.exceptions.DeadlineExceeded: 504 Deadline Exceeded\n")),
     Category.TRANSIENT_IO),
    ("a_failed_checkpoint_write_is_the_disk", triage.Signals(exit_code=1, log=(
        "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed "
        "writing file data/228: file write failed\n")), Category.CONFIG_ERROR),
    ("rays_autoscaler_without_a_gpu_node_is_unschedulable", triage.Signals(exit_code=1, log=(
        "(autoscaler +32s) Error: No available node types can fulfill resource request "
        "{'CPU': 1.0, 'GPU': 1.0}. Add suitable node types to this cluster.\n")),
     Category.UNSCHEDULABLE),
    ("kueue_without_quota_is_unschedulable", triage.Signals(events=(
        "Warning  Pending  workload/train  couldn't assign flavors to pod set main: insufficient "
        "quota for nvidia.com/gpu in flavor default-flavor, request > maximum capacity (8 > 4)\n")),
     Category.UNSCHEDULABLE),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("signals,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_failure_family_decides_the_category_on_both_engines(
        signals: triage.Signals, expected: Category, engine: str) -> None:
    diagnosis = triage.classify(signals, engine=engine)
    assert diagnosis is not None
    assert diagnosis.category is expected, diagnosis
