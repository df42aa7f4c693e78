"""The scheduler's and the platform's own words, exit signals and collectives the program got
wrong, judged on text published in public failure reports (each case names its source).

Submission refusals split by whether waiting can help: a request no node, zone or plan can ever
satisfy is a configuration error; a shortage or a limit that frees with time is unschedulable.
Only the pure classifier is involved: no cluster, cloud or GPU.
"""

from __future__ import annotations

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category

CASES = [
    # (source, log, exit code, expected category, expected rule)
    ("github.com/ArjunaCluster/ArjunaUsers/issues/112",
     "sbatch: error: Batch job submission failed: Requested node configuration is not available",
     1, Category.CONFIG_ERROR, "slurm.submit_impossible"),
    ("github.com/nf-core/fetchngs/issues/343",
     "  sbatch: error: invalid partition specified: pibu_el8\n"
     "  sbatch: error: Batch job submission failed: Invalid partition name specified",
     1, Category.CONFIG_ERROR, "slurm.submit_impossible"),
    ("github.com/ArjunaCluster/ArjunaUsers/issues/17",
     "sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
     "specified", 1, Category.CONFIG_ERROR, "slurm.submit_impossible"),
    ("github.com/mila-iqia/milatools/issues/113",
     "salloc: error: QOSMinCpuNotSatisfied\nsalloc: error: Job submit/allocate failed: Job violates "
     "accounting/QOS policy (job submit limit, user's size and/or time limits)",
     1, Category.CONFIG_ERROR, "slurm.qos_request_limit"),
    ("github.com/AMDResearch/hpcfund/issues/45",
     "sbatch: error:     --> error: requested timelimit exceeds max of 24 hours\nsbatch: error: Batch "
     "job submission failed: Job violates accounting/QOS policy (job submit limit, user's size "
     "and/or time limits)", 1, Category.CONFIG_ERROR, "slurm.qos_request_limit"),
    ("github.com/szcf-weiya/techNotes/issues/7",
     "salloc: error: QOSMaxSubmitJobPerUserLimit\nsalloc: error: Job submit/allocate failed: Job "
     "violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
     1, Category.UNSCHEDULABLE, "slurm.submit_limit"),
    ("github.com/mlr-org/batchtools/issues/199",
     "Error: Fatal error occurred: 101. Command 'sbatch' produced exit code 1. Output: 'sbatch: "
     "error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
     "user's size and/or time limits)'", 1, Category.UNSCHEDULABLE, "slurm.policy_violation"),
    ("github.com/elyall/wandb_on_slurm/issues/5",
     "slurmstepd: error: execve(): start-agent.sh: Permission denied\n"
     "srun: error: my-node01: task 0: Exited with exit code 13", 13, Category.CONFIG_ERROR,
     "slurm.execve"),
    ("github.com/yechengxi/DBG2OLC/issues/48", "slurmstepd: error: execve():permission denied.",
     None, Category.CONFIG_ERROR, "slurm.execve"),
    ("github.com/ArjunaCluster/ArjunaUsers/issues/21",
     "slurmstepd: error: execve(): /tmp/slurmd/job2997814/slurm_script: No such file or directory",
     None, Category.NODE_FAILURE, "slurm.spool_script_missing"),
    ("github.com/burrmill/burrmill/issues/15",
     "   JobState=PENDING Reason=launch_failed_requeued_held Dependency=(null)",
     None, Category.NODE_FAILURE, "slurm.launch_failed"),
    ("github.com/ArjunaCluster/ArjunaUsers/issues/63",
     'Jobs get the status "(launch failed requeued held)"', None, Category.NODE_FAILURE,
     "slurm.launch_failed"),
    ("github.com/kubernetes/kubernetes/issues/102820",
     "Status:         Failed.\nReason:         Shutdown\nMessage:        Node is shutting, evicting pods",
     None, Category.PREEMPTED, "k8s.node_shutdown"),
    ("github.com/aws/amazon-ecs-agent/issues/3021",
     "CannotStartContainerError: Error response from daemon: OCI runtime create failed: "
     "container_linux.go:380: starting container process caused: container init was OOM-killed "
     "(memory limit too low?): unknown", None, Category.HOST_OOM, "runtime.init_oom"),
    ("github.com/kubernetes/kubernetes/issues/130145",
     "Reason:            UnexpectedAdmissionError\nMessage:         Pod Allocate failed due to "
     "requested number of devices unavailable for nvidia.com/gpu. Requested:1, Available: 0, "
     "which is unexpected", None, Category.UNSCHEDULABLE, "k8s.admission_devices"),
    ("github.com/kubernetes/kubernetes/issues/97131",
     "rojin-2q6ld   0/1     UnexpectedAdmissionError   0          4s\nMessage:        Pod Allocate "
     "failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = "
     "Unknown desc = Unable to retrieve list of available devices: error creating nvml.Device 5: "
     "nvml: GPU is lost, which is unexpected", None, Category.GPU_FAULT, "gpu_fault.hardware"),
    ("github.com/cdanielmachado/carveme/issues/34",
     "TERM_THREADLIMIT: job killed after reaching LSF thread limit.\nExited with exit code 143.",
     143, Category.CONFIG_ERROR, "lsf.request_refused"),
    ("github.com/bcbio/bcbio-nextgen/issues/2803",
     "Error in rusage section: The merged job-level and application-level rusage\nvalue is outside "
     "the range set by RESRSV_LIMIT defined in lsb.queues. Job\nnot submitted.",
     None, Category.CONFIG_ERROR, "lsf.request_refused"),
    ("github.com/skyplane-project/skyplane/issues/172",
     "09:19:21 [WARN]  Retrying start_instance due to An error occurred (Unsupported) when calling "
     "the RunInstances operation: Your requested instance type (m5.8xlarge) is not supported in your "
     "requested Availability Zone (us-east-1e). Please retry your request by not specifying an "
     "Availability Zone or choosing us-east-1a, us-east-1b. (attempt 2/4)",
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/dspace-group/dspace-reference-architecture-aws/issues/85",
     "Could not launch On-Demand Instances. Unsupported - Your requested instance type (p2.xlarge) "
     "is not \nsupported in your requested Availability Zone (eu-central-1c).",
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/aws/amazon-sagemaker-examples/issues/1001",
     "An error occurred (ResourceLimitExceeded) when calling the CreateTrainingJob operation: The "
     "requested resource training-job/ml.p2.xlarge is not available in this region",
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/aws/amazon-sagemaker-examples/issues/3494",
     "botocore.exceptions.ClientError: An error occurred (ValidationException) when calling the "
     "CreateTrainingJob operation: Unsupported instance type ml.p3dn.24xlarge",
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/taskcluster/community-tc-config/pull/75",
     "Invalid value for field 'resource.machineType': 'zones/us-east4-a/machineTypes/n2-highcpu-16'. "
     "Machine type with name 'n2-highcpu-16' does not exist in zone 'us-east4-a'.",
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/fastai/course-v3/issues/493",
     "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - The resource "
     "'projects/fastai-20200406/zones/us-central1-a/acceleratorTypes/nvidia-tesla-p100' was not "
     "found", None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/GoogleCloudPlatform/vertex-ai-samples/issues/213",
     'InvalidArgument: 400 Accelerator "NVIDIA_TESLA_K80" is not supported for machine type '
     '"n1-standard-4"', None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/microsoft/PartsUnlimitedMRP/issues/133",
     '{ "error": { "code": "SkuNotAvailable", "message": "The requested size for resource '
     "'/subscriptions/2c96/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm' is "
     "currently not available in location 'brazilsouth' zones '' for subscription '2c96'. Please "
     'try another size or deploy to a different location or zones." } }',
     None, Category.CONFIG_ERROR, "cloud.unsupported_request"),
    ("github.com/Azure/azure-cli/issues/32628",
     "Code: SkuNotAvailable\n        Message: The requested VM size for resource 'Following SKUs "
     "have failed for Capacity Restrictions: Standard_D4ads_v5' is currently not available in "
     "location 'eastus'. Please try another size or deploy to a different location or different "
     "zone.", None, Category.UNSCHEDULABLE, "cloud.capacity_restriction"),
    ("github.com/tensorflow/tensorflow/issues/18147",
     'Thread 1 "python3" received signal SIGILL, Illegal instruction.', None,
     Category.CONFIG_ERROR, "config.illegal_instruction"),
    ("github.com/serge-chat/serge/issues/146", "Docker exited code 132", None,
     Category.CONFIG_ERROR, "config.illegal_instruction"),
    ("github.com/Lightning-AI/pytorch-lightning/issues/19106",
     "    work = default_pg.broadcast([tensor], opts)\nRuntimeError: Detected mismatch between "
     "collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=21, "
     "OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long)", None, Category.CODE_ERROR,
     "code.collectives_misuse"),
    ("github.com/NVIDIA/nccl/issues/296",
     "init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at "
     "and around rank 39.", None, Category.CODE_ERROR, "code.collectives_misuse"),
    ("github.com/intel/torch-xpu-ops/issues/1525",
     "ValueError: trying to initialize the default process group twice!\n"
     "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1333",
     None, Category.CODE_ERROR, "code.collectives_misuse"),
]


@pytest.mark.parametrize(("source", "log", "exit_code", "category", "rule_id"), CASES,
                         ids=[c[0].split("github.com/")[1] for c in CASES])
def test_published_platform_and_signal_text_is_read_by_its_mechanism(
        source: str, log: str, exit_code: int | None, category: Category, rule_id: str) -> None:
    d = triage.classify(triage.Signals(exit_code=exit_code, log=log))
    assert d is not None
    assert (d.category, d.rule_id) == (category, rule_id), (source, d.signature)
    assert d.retryable is (category in (Category.UNSCHEDULABLE, Category.NODE_FAILURE,
                                        Category.GPU_FAULT, Category.PREEMPTED)), source


def test_a_refusal_naming_its_reason_outranks_the_bare_policy_line() -> None:
    """The bare QOS violation is a weak call; the per-job reason Slurm prints beside it decides."""
    bare = triage.classify(triage.Signals(log=(
        "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit "
        "limit, user's size and/or time limits)")))
    named = triage.classify(triage.Signals(log=(
        "sbatch: error: qosmaxwalldurationperjoblimit\nsbatch: error: batch job submission failed: "
        "job violates accounting/qos policy (job submit limit, user's size and/or time limits)")))
    assert bare is not None and named is not None
    assert (bare.category, bare.weak) == (Category.UNSCHEDULABLE, True)
    assert (named.category, named.weak, named.retryable) == (Category.CONFIG_ERROR, False, False)


def test_sigkill_without_memory_evidence_is_a_weak_unknown_and_sigill_is_not_a_segfault() -> None:
    killed = triage.classify(triage.Signals(exit_code=137, reason="Error", log=(
        "    Last State: Terminated\n      Reason: Error\n      Exit Code: 137")))
    illegal = triage.classify(triage.Signals(exit_code=132))
    assert killed is not None and illegal is not None
    assert (killed.category, killed.weak, killed.retryable) == (Category.UNKNOWN, True, True)
    assert (illegal.category, illegal.rule_id, illegal.retryable) == (
        Category.CONFIG_ERROR, "exit.sigill", False)


# torchrun's agent relaying the SIGTERM it received (github.com/determined-ai/determined/issues/8915):
# a platform reclaiming the node, a person stopping the run and a launcher's teardown all print it.
AGENT_SIGTERM = (
    "[2024-02-27T21:35:32.106313Z] fa88a9df || WARNING: torch.distributed.elastic.agent.server.api:"
    "Received 15 death signal, shutting down workers\n"
    "[2024-02-27T21:35:32.106517Z] fa88a9df || WARNING: torch.distributed.elastic.multiprocessing."
    "api:Sending process 165 closing signal SIGTERM\n")


def test_who_stopped_it_read_from_the_log_alone_is_a_weak_call() -> None:
    d = triage.classify(triage.Signals(exit_code=143, log=AGENT_SIGTERM))
    assert d is not None
    assert (d.category, d.provenance, d.weak) == (Category.PREEMPTED, "log", True)
    assert d.to_dict()["provenance"] == "log"


def test_the_backends_record_of_a_stop_outranks_the_log() -> None:
    """The local supervisor recorded a cancellation: the relayed SIGTERM is its consequence."""
    d = triage.classify(triage.Signals(exit_code=143, reason="Cancelled", log=AGENT_SIGTERM))
    assert d is not None
    assert (d.category, d.provenance, d.weak) == (Category.USER_CANCELLED, "platform", False)


def test_a_stop_record_wins_a_tie_with_a_log_verdict_of_another_stop() -> None:
    """Slurm's log line says preemption, the backend's record says a person cancelled the job:
    equal strength, and the record decides."""
    log = ("slurmstepd: error: *** JOB 494583 ON gpu-7 CANCELLED AT 2024-04-20T09:09:37 DUE TO "
           "PREEMPTION ***")
    from_log = triage.classify(triage.Signals(exit_code=143, log=log))
    both = triage.classify(triage.Signals(exit_code=143, reason="Cancelled", log=log))
    assert from_log is not None and both is not None
    assert (from_log.category, from_log.weak) == (Category.PREEMPTED, True)
    assert (both.category, both.decided_by, both.weak) == (
        Category.USER_CANCELLED, "platform record", False)


@pytest.mark.parametrize(("source", "log"), [
    ("github.com/sdatkinson/NAMTrainerColab/issues/7",
     "--> 518             torch._foreach_add_(\n    519                 device_state_steps, "
     "torch.tensor(1.0, device=\"cpu\"), alpha=1.0\n\nKeyboardInterrupt: \n\nDuring handling of the "
     "above exception, another exception occurred:\n\nNameError                                 "
     "Traceback (most recent call last)\n[<ipython-input-1-2c9b0f02eea8>](https://localhost:8080/#) "
     "in <cell line: 69>()"),
    ("github.com/k2-fsa/icefall/issues/1084",
     "    fd_event_list = self._selector.poll(timeout)\nKeyboardInterrupt\n^CProcess Process-3:2:\n"
     "Process Process-3:11:\nTraceback (most recent call last):\nError in atexit._run_exitfuncs:\n"
     "  File \"/home/anaconda3/envs/k2/lib/python3.8/multiprocessing/process.py\", line 318, in "
     "_bootstrap\n    util._exit_function()"),
], ids=["NAMTrainerColab-7", "icefall-1084"])
def test_an_error_in_the_teardown_after_ctrl_c_is_the_persons_stop(source: str, log: str) -> None:
    d = triage.classify(triage.Signals(exit_code=1, log=log))
    assert d is not None
    assert (d.category, d.rule_id) == (Category.USER_CANCELLED, "cancelled.keyboard_teardown"), source
    assert d.weak and d.provenance == "log"


@pytest.mark.parametrize(("source", "message"), [
    ("github.com/pulp/pulp-operator/issues/1315",
     '(combined from similar events): Error creating: pods "pulp-reset-admin-password-qph9d-7jfr2" is '
     'forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
     '(container "reset-admin-password" must set securityContext.allowPrivilegeEscalation=false)'),
    ("github.com/open-policy-agent/gatekeeper/issues/2695",
     'Error creating: pods "gatekeeper-update-crds-hook-rgzh6" is forbidden: violates PodSecurity '
     '"restricted:v1.24": seccompProfile (pod or container "install-oneagent" must set '
     'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'),
    ("github.com/openkruise/kruise/issues/1863",
     'Error creating: admission webhook "mpod.kb.io" denied the request: Internal error occurred: the '
     'spec replicas field ".spec.pytorchReplicaSpecs.Worker.replicas" does not exist'),
], ids=["pulp-operator-1315", "gatekeeper-2695", "kruise-1863"])
def test_admission_refusing_the_pods_is_a_configuration_error(source: str, message: str) -> None:
    """Read from the Job's FailedCreate event (the platform's record) and from the same text in a log."""
    event = {"type": "Warning", "reason": "FailedCreate", "message": message}
    from_event = triage.classify(triage.Signals(events=(event,)))
    from_log = triage.classify(triage.Signals(log="  Warning  FailedCreate  2m6s  job-controller  " + message))
    assert from_event is not None and from_log is not None
    assert (from_event.category, from_event.rule_id, from_event.provenance) == (
        Category.CONFIG_ERROR, "event.admission_refused", "platform"), source
    assert (from_log.category, from_log.rule_id) == (Category.CONFIG_ERROR, "k8s.admission_refused")


def test_a_pod_refused_while_its_pod_group_waits_is_not_a_configuration_error() -> None:
    # github.com/volcano-sh/volcano/issues/621: the scheduler has not admitted the gang yet.
    message = ('admission webhook "validatepod.volcano.sh" denied the request: failed to create pod '
               '<test/failed-delete-job-fail-0> as the podgroup phase is Pending')
    d = triage.classify(triage.Signals(events=({"reason": "FailedCreate", "message": message},)))
    assert d is not None and (d.category, d.retryable) == (Category.UNKNOWN, True)
