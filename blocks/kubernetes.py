"""The Kubernetes Job backend block: what a platform engineer sets once per cluster, in the UI.

Cluster access comes from prefect-kubernetes' `KubernetesCredentials` block (a stored kubeconfig
and context, or in-cluster config when it holds none). `backend()` builds the core adapter
(`trainguard.core.backends.kubernetes.backend.KubernetesBackend`); the client itself is created lazily inside it,
so no live client ever crosses a task boundary.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from prefect.blocks.core import Block
from prefect_kubernetes.credentials import KubernetesCredentials
from pydantic import Field

from blocks import jobfields

from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import AttemptVolume, JobSettings


_SCHEMAS: dict[tuple[Any, ...], dict[str, Any]] = {}


class KubernetesJobBackend(Block):
    """Runs each training attempt as a Kubernetes Job and freezes the cluster's evidence before cleanup."""

    _block_type_name = "trainguard Kubernetes Job Backend"
    _block_type_slug = "trainguard-kubernetes-job-backend"
    _description = "Run training attempts as Kubernetes Jobs, supervised by watch, with evidence kept before cleanup."

    credentials: KubernetesCredentials | None = Field(
        default=None, title="Cluster credentials",
        description="A KubernetesCredentials block; empty = in-cluster config, else the default kubeconfig.")
    kubeconfig_path: str | None = Field(
        default=None, title="Kubeconfig file", description="Used when no credentials block is set (e.g. from the CLI).")
    context: str | None = Field(default=None, title="Kubeconfig context",
        description="A context of the kubeconfig; empty = its current context.")
    namespace: str = Field(default="default", title="Namespace", description="Where Jobs, pods and ConfigMaps go.")
    image: str = Field(title="Image", description="The training image; it needs a Python 3 for trainguard's entrypoint.")
    python: str = Field(
        default="python3", title="Python in the image",
        description="The Python 3 that runs trainguard's entrypoint, evidence collector and checkpoint lister: "
        "a name on the image's PATH or an absolute path, e.g. /opt/conda/bin/python.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(default=None, title="Image pull policy",
        description="Always, IfNotPresent or Never; empty = the cluster's default for the tag.")
    image_pull_secrets: list[str] = Field(default_factory=list, title="Image pull secrets",
        description="Names of docker-registry Secrets in the namespace, for a private registry.")
    cpu_request: str | None = Field(default=None, title="CPU request", examples=["30"],
        description="The training container's CPU request (Kubernetes quantity); empty = none.")
    cpu_limit: str | None = Field(default=None, title="CPU limit",
        description="The training container's CPU limit; empty = none.")
    memory_request: str | None = Field(default=None, title="Memory request", examples=["200Gi"],
        description="Memory request (quantity); raised after a retried host OOM if the retry policy says so.")
    memory_limit: str | None = Field(default=None, title="Memory limit", examples=["240Gi"],
        description="Memory limit (quantity); the container is OOM-killed above it; raised like the request.")
    node_selector: dict[str, str] = Field(default_factory=dict, title="Node selector",
        description="Node labels the training pod must match, e.g. {nvidia.com/gpu.product: A100}.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, title="Tolerations",
                                              description="As in a pod spec, e.g. {key: nvidia.com/gpu, operator: Exists}.")
    priority_class: str | None = Field(default=None, title="Priority class",
        description="A PriorityClass name; a higher priority may preempt other pods to run.")
    service_account: str | None = Field(default=None, title="Service account (of the training pod)",
        description="The training pod's service account; empty = the namespace's default.")
    volumes: list[dict[str, Any]] = Field(default_factory=list, title="Extra volumes", description="Pod volumes.")
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list, title="Extra volume mounts",
        description="Mounts of the extra volumes into the training container, as in a pod spec.")
    shm_size: str | None = Field(default="1Gi", title="/dev/shm size",
                                 description="A memory-backed /dev/shm for data loaders and NCCL; empty = none.")
    labels: dict[str, str] = Field(default_factory=dict, title="Labels",
        description="Added to the Job and its pods, next to app.kubernetes.io/* and trainguard.io/*.")
    annotations: dict[str, str] = Field(default_factory=dict, title="Annotations",
        description="Added to the Job and its pods.")
    job_template: dict[str, Any] | None = Field(
        default=None, title="Job template override",
        description="Raw Job fields merged over what trainguard writes (mappings merged, the rest replaced).")
    attempt_volume: Literal["pvc", "hostPath", "emptyDir"] = Field(
        default="pvc", title="Attempt volume", description="Where logs, core dumps and crash reports go. "
        "emptyDir dies with the pod: only the API's evidence survives then.")
    attempt_claim: str = Field(default="trainguard-attempts", title="Attempt volume claim (PVC)",
        description="The claim holding each attempt's folder when the attempt volume is pvc.")
    attempt_host_path: str = Field(default="/var/lib/trainguard/attempts", title="Attempt volume host path",
        description="The node folder holding each attempt's folder when the attempt volume is hostPath.")
    mount_whole_attempt_volume: bool = Field(
        default=False, title="Mount every run's attempt folders",
        description="Off (the default): the training pod mounts only its own attempt folder (a subPath), so a job "
        "cannot read or rewrite other runs' raw logs and crash reports. On: the whole attempt volume at "
        "/trainguard/attempts, read-write, for jobs that must read other attempts' files (and storage that "
        "cannot do subPath mounts).")
    mount_service_account_token: bool = Field(
        default=False, title="Mount the service-account token in the training pod",
        description="Off (the default): automountServiceAccountToken is false, since training never calls the "
        "Kubernetes API. On: the pod's service account decides, for training code that needs the API.")
    checkpoint_claim: str = Field(default="trainguard-checkpoints", title="Checkpoint claim (PVC)",
                                  description="Shared by every attempt of a run; each run has its own folder.")
    fail_job_exit_codes: list[int] = Field(default_factory=lambda: [2, 126, 127], title="Exit codes that fail the Job at once",
        description="Exit codes no retry can cure (usage error, not executable, not found): the Job fails without waiting.")
    failed_job_ttl_seconds: int = Field(
        default=86400, ge=0, title="Keep failed Jobs (s)",
        description="How long a failed Job stays after its evidence is stored (0 = delete at once).")
    unschedulable_seconds: float = Field(default=600.0, ge=0, title="Wait while unschedulable (s)",
        description="How long a pod may stay unschedulable before the attempt ends as unschedulable.")
    start_error_seconds: float = Field(default=60.0, ge=0, title="Wait on image pull / start errors (s)",
        description="How long a pod may fail to pull its image or start before the attempt ends.")
    evidence_copy_budget_bytes: int = Field(
        default=256 * 1024 * 1024, ge=0, title="Attempt folder copy budget (bytes)",
        description="What the collector pod copies of the attempt's folder (log, crash report, snapshots, core "
        "dumps), counted by apparent size, so a sparse file counts whole. A file over what is left (a large "
        "core dump) stays on the attempt volume and the evidence says where.")
    stack_sweep_seconds: float = Field(
        default=30.0, ge=0, title="Stack capture bound (s)",
        description="Before a stop reaches the ranks, the entrypoint takes every rank's stack (py-spy, else "
        "Python's faulthandler) within this many seconds; the pod's termination grace is 30 s plus this, so the "
        "command keeps its own 30 s after the stop reaches it. 0 = off (and the pod's grace is the default).")
    sys_ptrace: bool = Field(
        default=False, title="Add SYS_PTRACE (native stacks)",
        description="Off (the default): the training container gets no extra capability and the stacks are "
        "Python's. On: SYS_PTRACE is added, so py-spy can read native (C/C++) frames too.")
    job_kind: Literal["Job", "PyTorchJob"] = Field(
        default="Job", title="Kind of each attempt",
        description="Job: a batch/v1 Job (an Indexed Job and a headless Service on several nodes). PyTorchJob: "
        "a Kubeflow PyTorchJob (kubeflow.org/v1; Master and Worker replicas, restartPolicy Never, "
        "runPolicy.backoffLimit 0, cleanPodPolicy None) for clusters that run the training operator.")
    hold_mode: bool = Field(
        default=True, title="Hold failed pods (several nodes; Kubernetes 1.29+)",
        description="On: a multi-node attempt's Indexed Job has backoffLimitPerIndex 0, so a failed pod is not "
        "retried and the other pods are not deleted: every pod's log is read before trainguard deletes the Job. "
        "Off, for clusters before 1.29 (no per-index back-off): backoffLimit 0; the Job controller deletes the "
        "other pods when one fails, and their evidence is taken while they terminate.")
    one_pod_per_node: bool = Field(
        default=False, title="One pod per node (several nodes)",
        description="Required pod anti-affinity between the pods of one attempt; it becomes preferred, and the "
        "attempt says so, when a pod cannot be placed because of it (fewer schedulable nodes than pods).")
    master_port: int = Field(
        default=29500, ge=1, le=65535, title="Rendezvous port (several nodes)",
        description="The port the ranks meet on at the first pod (MASTER_PORT, torchrun's PET_MASTER_PORT).")
    survivor_grace_seconds: float = Field(
        default=30.0, ge=0, title="Grace for the other pods after one fails (s)",
        description="Several nodes: once one pod failed, how long the others may take to fail on their own "
        "(they usually do within seconds, and what they print dates the failure) before evidence is collected "
        "from every pod and the Job is deleted.")
    checkpoint_verify_seconds: float = jobfields.checkpoint_verify("the checkpoint lister pod")
    local_root: str | None = Field(default=None, title="Local folder for triage facts",
                                   description="On the flow's machine, this user's only (refused if another "
                                   "user's or writable by others); trainguard-kube-<uid> in the temporary folder "
                                   "when empty.")

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The block's JSON schema, built once per class and arguments and handed out as a copy.

        `Block.save` asks for the whole schema again for each of the ~40 fields (to see which hold
        secrets); built afresh each time, saving this block took 8-11 s on a busy machine.
        """
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _SCHEMAS:
            _SCHEMAS[key] = super().model_json_schema(*args, **kwargs)
        return copy.deepcopy(_SCHEMAS[key])

    def connect(self) -> KubeApi:
        """A client for the cluster, from the credentials block, the kubeconfig, or in-cluster config."""
        cluster = self.credentials.cluster_config if self.credentials else None
        if cluster is not None:
            return KubeApi.from_config_dict(cluster.config, cluster.context_name)
        if self.kubeconfig_path or self.context:
            return KubeApi.from_kubeconfig(self.kubeconfig_path, self.context)
        try:
            return KubeApi.in_cluster()
        except KubeError:  # not in a pod: the default kubeconfig, as kubectl would
            return KubeApi.from_kubeconfig(None, None)

    def settings(self) -> KubeSettings:
        """The core settings these fields describe."""
        job = JobSettings(
            image=self.image, namespace=self.namespace, image_pull_policy=self.image_pull_policy,
            image_pull_secrets=tuple(self.image_pull_secrets), cpu_request=self.cpu_request, cpu_limit=self.cpu_limit,
            memory_request=self.memory_request, memory_limit=self.memory_limit, node_selector=dict(self.node_selector),
            tolerations=tuple(self.tolerations), priority_class=self.priority_class,
            service_account=self.service_account, volumes=tuple(self.volumes), volume_mounts=tuple(self.volume_mounts),
            shm_size=self.shm_size or None, labels=dict(self.labels), annotations=dict(self.annotations),
            job_template=self.job_template,
            attempt_volume=AttemptVolume(self.attempt_volume, self.attempt_claim, self.attempt_host_path),
            checkpoint_claim=self.checkpoint_claim, fail_job_exit_codes=tuple(self.fail_job_exit_codes),
            python=self.python, attempt_sub_path=not self.mount_whole_attempt_volume,
            automount_service_account_token=self.mount_service_account_token,
            stack_sweep_seconds=self.stack_sweep_seconds, sys_ptrace=self.sys_ptrace,
            hold_mode=self.hold_mode, one_pod_per_node=self.one_pod_per_node, master_port=self.master_port,
            job_kind=self.job_kind,
        )
        return KubeSettings(job=job, unschedulable_seconds=self.unschedulable_seconds,
                            start_error_seconds=self.start_error_seconds,
                            failed_job_ttl_seconds=self.failed_job_ttl_seconds, local_root=self.local_root,
                            evidence_copy_budget_bytes=self.evidence_copy_budget_bytes,
                            survivor_grace_seconds=self.survivor_grace_seconds,
                            checkpoint_verify_seconds=self.checkpoint_verify_seconds)

    def backend(self) -> KubernetesBackend:
        """The Kubernetes Job adapter this block describes."""
        return KubernetesBackend(self.connect, self.settings())
