"""What a hostile or careless training job leaves cannot steer, break or leak through the evidence.

Each scenario runs the Job trainguard writes on kubesim (the real client, the real entrypoint, the
real collector pod), lets the job leave what an attacker or an unlucky script would, then freezes
the evidence and checks what was kept. Nothing is patched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from evidence_helpers import Kept, job_failed, kept_facts, kept_signals, pods_of, trainguard_job, training_job
from hostile import HOST_MARKER, HOSTILE_TRAINER, ODD_NAME, host_file, within

import kubesim.fixture
from trainguard.core import masking
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core.backends.kubernetes.evidence import collect_kubernetes_evidence
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.taxonomy import Category
from trainguard.core.triage import classify
from waiting import wait_for

CUDA_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.15 GiB of which 1.2 GiB is free.")


def _collect(kube: KubeApi, ns: str, job: str, tmp_path: Path, run_id: str = "run-1") -> Kept:
    store = LocalEvidenceStore(tmp_path / "evidence")
    manifest = collect_kubernetes_evidence(kube, ns, job, run_id, 1, store, kept_dir=tmp_path / "triage",
                                           collector_timeout_seconds=30)
    return Kept(store, manifest)


def _failed(kube: KubeApi, ns: str, name: str) -> None:
    wait_for(lambda: job_failed(kube, ns, name), timeout=30, what=f"Job {name} Failed")


def test_triage_reads_the_entrypoints_log_not_the_first_file_a_job_put_under_logs(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    script = ("import os, pathlib\n"
              "logs = pathlib.Path(os.environ['TRAINGUARD_WORKSPACE']) / 'logs'\n"
              "logs.mkdir(parents=True, exist_ok=True)\n"
              "for name in ('a.log', 'metrics.log'):\n"
              "    (logs / name).write_text('epoch 2 acc 0.62\\n')\n"
              f"print({CUDA_OOM!r}, flush=True)\n"
              "raise SystemExit(1)\n")
    job = trainguard_job(kube, ns, script)
    _failed(kube, ns, job)

    kept = _collect(kube, ns, job, tmp_path)

    assert b"epoch 2 acc" in kept.read("logs/metrics.log")  # kept as evidence, but not what decides
    assert kept_facts(tmp_path / "triage").log_item == "logs/train-run-1-attempt-1.log"
    assert classify(kept_signals(tmp_path / "triage")).category is Category.CUDA_OOM
    assert b"CUDA out of memory" in kept.read("crash-tail.txt")


# A secret_env value with no shape any rule knows: only the value the flow resolved masks it.
OPAQUE = "opaque-quartz-lantern-8841"  # lower case: it is also in an image name
TOKEN = "hf_MaskMeEverywhere0123456789"
_LEAKS = ("import os, sys, time\n"
          f"print('loading with', {OPAQUE!r}, 'and', {TOKEN!r}, flush=True)\n"
          "marker = os.path.join(os.environ['TRAINGUARD_WORKSPACE'], 'ran-once')\n"
          "if not os.path.exists(marker):\n"
          "    open(marker, 'w').close()\n"
          f"    print('Traceback: RuntimeError: bad auth', {OPAQUE!r}, flush=True)\n"
          "    sys.exit(1)\n"
          "time.sleep(60)\n")


def _leaky_job(name: str) -> dict[str, Any]:
    """A Job whose spec, events and output all carry the secret, and whose container restarted once."""
    job = training_job(name, _LEAKS, run_id="run-1", restart="OnFailure", backoff=3)
    spec = job["spec"]["template"]["spec"]
    train = spec["containers"][0]
    train["args"] = ["--run-name", OPAQUE]  # a spec field the user wrote
    train["env"].append({"name": "WANDB_NOTES", "value": f"notes {OPAQUE}"})
    spec["containers"].append({"name": "fetch", "image": f"registry.invalid/{OPAQUE}:1", "command": ["x"]})
    return job


def _everything_written(root: Path) -> list[tuple[Path, bytes]]:
    return [(path, path.read_bytes()) for path in sorted(root.rglob("*")) if path.is_file()]


def test_every_piece_of_a_kubernetes_attempt_is_stored_masked(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    masking.register([OPAQUE])  # as resolving the spec's secret_env does
    kube.create_job(ns, _leaky_job("leaky"))

    def restarted() -> str | None:
        for pod in pods_of(kube, ns, "leaky"):
            statuses = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or ()}
            events = kube.list_events(ns, field_selector=f"involvedObject.name={pod['metadata']['name']}")
            pulled = any("registry.invalid" in str(e.get("message")) for e in events.get("items") or ())
            if statuses.get("train", {}).get("restartCount") and pulled:
                return str(pod["metadata"]["name"])
        return None

    pod = wait_for(restarted, timeout=60, what="the container restarted and the pull failed")
    kept = _collect(kube, ns, "leaky", tmp_path)

    base = f"kubernetes/pods/{pod}"
    for name in ("kubernetes/job.json", f"{base}.json", f"{base}/logs/train.log", f"{base}/logs/train.previous.log",
                 f"{base}/describe.txt", "kubernetes/events.json", "kubernetes/triage.json", "crash-tail.txt",
                 "logs/train-run-1-attempt-1.log", "termination-message.txt"):
        assert name in kept.items, (name, kept.why(name))
    assert b"***" in kept.read(f"{base}/logs/train.previous.log")
    assert b"bad auth ***" in kept.read(f"{base}/logs/train.previous.log")
    written = _everything_written(tmp_path / "evidence") + _everything_written(tmp_path / "triage")
    leaks = [str(path) for path, data in written if OPAQUE.encode() in data or TOKEN.encode() in data
]
    assert not leaks, leaks
    kube.delete_job(ns, "leaky")


def test_the_live_log_and_the_outcome_are_masked(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    masking.register([OPAQUE])
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                     local_root=str(tmp_path)))
    code = f"print('token', {OPAQUE!r}, {TOKEN!r}, flush=True); raise SystemExit(1)"
    shown: list[str] = []
    ref = b.provision("r-live", 1)
    outcome = b.run(ref, Launch(run_id="r-live", attempt=1, command=("python", "-c", code)), on_line=shown.append)
    assert outcome.exit_code == 1
    assert not [line for line in shown if OPAQUE in line or TOKEN in line], shown
    assert OPAQUE not in outcome.log_tail and TOKEN not in outcome.log_tail and "token" in outcome.log_tail


def _volume_folder(sim: kubesim.fixture.Sim, ns: str, *parts: str) -> Path:
    return Path(sim.root) / "pvc" / ns / f"{ns}-attempts" / "runs" / Path(*parts)


@pytest.mark.parametrize("swap", ["attempt folder to a host folder", "attempt folder to another run's",
                                  "run folder to a host folder"])
def test_an_attempt_folder_replaced_by_a_symlink_is_not_followed_by_the_collector(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path, swap: str,
) -> None:
    other = trainguard_job(kube, ns, "print('other run: HF_TOKEN=hf_OtherRunsSecret000000000000')", run_id="other")
    job = trainguard_job(kube, ns, "print('step 1 loss 2.0'); raise SystemExit(1)")
    _failed(kube, ns, job)
    wait_for(lambda: kube.read_job(ns, other).get("status", {}).get("succeeded"), what="the other run done")
    host = tmp_path / "host"
    host.mkdir()
    (host / "crash-report.json").write_bytes(HOST_MARKER)
    (host / "logs").mkdir()
    (host / "logs" / "train-run-1-attempt-1.log").write_bytes(HOST_MARKER)
    # what a pod that mounts the whole volume (a sidecar, an older Job) can do to this attempt's folder
    if swap == "run folder to a host folder":
        moved, link, target = _volume_folder(sim, ns, "run-1"), _volume_folder(sim, ns, "run-1"), host.parent
        (host.parent / "attempt-1").symlink_to(host)
    else:
        moved = link = _volume_folder(sim, ns, "run-1", "attempt-1")
        target = host if "host" in swap else Path("../other/attempt-1")
    moved.rename(moved.with_name(moved.name + "-moved"))
    link.symlink_to(target)

    kept = _collect(kube, ns, job, tmp_path)

    written = _everything_written(tmp_path / "evidence")
    assert not [str(p) for p, data in written if HOST_MARKER in data or b"OtherRunsSecret" in data]
    assert not kept.names("logs/") and "crash-report.json" not in kept.items
    assert "symbolic link" in kept.why("logs/train-run-1-attempt-1.log"), kept.missing


def test_a_checkpoint_folder_replaced_by_a_symlink_is_not_listed(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    job = trainguard_job(kube, ns, "print('step 1 loss 2.0'); raise SystemExit(1)")
    _failed(kube, ns, job)
    host = tmp_path / "host-models"
    host.mkdir()
    (host / "step-000999-host-only.pt").write_bytes(HOST_MARKER)
    folder = Path(sim.root) / "pvc" / ns / f"{ns}-checkpoints" / "run-1"
    folder.rename(folder.with_name("run-1-moved"))
    folder.symlink_to(host)

    kept = _collect(kube, ns, job, tmp_path)

    listing = kept.json("checkpoints.json")
    assert listing["files"] == [] and "symbolic link" in listing["absent"]
    assert not [str(p) for p, data in _everything_written(tmp_path / "evidence") if b"host-only" in data]
    assert "crash-report.json" in kept.items  # the attempt folder itself is still read


# A pod's folder is a bind mount: a hard link from it to a host file fails (EXDEV). Another run's
# file on the same volume is what a hard link can reach; the test makes that one from outside.
_LINK = 'os.link(host, os.path.join(snap, "hardlink.json"))'
KUBE_TRAINER = HOSTILE_TRAINER.replace(_LINK, "pass")


def test_what_a_hostile_job_leaves_in_its_folder_is_refused_with_reasons_and_collection_ends(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    assert _LINK in HOSTILE_TRAINER
    leak = host_file(tmp_path / "host")
    job = trainguard_job(kube, ns, KUBE_TRAINER.replace("sys.argv[1]", repr(str(leak))))
    _failed(kube, ns, job)
    theirs = _volume_folder(sim, ns, "other", "attempt-1", "raw.log")
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(HOST_MARKER)
    os.link(theirs, _volume_folder(sim, ns, "run-1", "attempt-1", "snapshot", "hardlink.json"))

    kept = within(90, lambda: _collect(kube, ns, job, tmp_path), "collection to end")

    assert not [str(p) for p, data in _everything_written(tmp_path / "evidence") if HOST_MARKER in data]
    reasons = {miss.name: miss.reason for miss in kept.manifest.missing}
    expected = {"coredumps/core.leak": "symbolic link", "coredumps/core.pipe": "FIFO",
                "coredumps/core.sparse": "apparent size", "snapshot/leak.json": "symbolic link",
                "snapshot/hostdir": "symbolic link", "snapshot/hardlink.json": "hard link"}
    if os.geteuid() == 0:
        expected["coredumps/core.zero"] = "device"
    for name, word in expected.items():
        assert word in reasons.get(name, ""), f"{name}: {reasons.get(name)!r}; missing: {reasons}"
    odd = [item for item in kept.manifest.items if item.original_name == f"coredumps/{ODD_NAME}"]
    assert len(odd) == 1 and odd[0].name == "coredumps/%1B[31mred%E2%80%AEexe.core"
    assert all(item.name.isprintable() and item.key.isprintable() for item in kept.manifest.items)
    assert all(miss.name.isprintable() and miss.reason.isprintable() for miss in kept.manifest.missing)
    skipped = {entry["name"]: entry["reason"] for entry in kept.json("checkpoints.json").get("skipped", [])}
    assert "FIFO" in skipped["step-000009.pt"] and "symbolic link" in skipped["step-000005.pt"]
    assert classify(kept_signals(tmp_path / "triage")).category is Category.CODE_ERROR


def test_a_checkpoint_folder_of_thousands_of_shards_keeps_the_volumes_evidence(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    script = ("import os\n"
              "ck = os.environ['TRAINGUARD_CHECKPOINT_DIR']\n"
              "os.makedirs(ck + '/step-000100', exist_ok=True)\n"
              "for i in range(3000):\n"
              "    open(ck + '/step-000100/model-%05d-of-03000-tensor-parallel-rank-07.safetensors' % i, 'wb')"
              ".write(b'w')\n"
              "print('step 100 loss 0.1', flush=True)\n"
              "raise SystemExit(1)\n")
    job = trainguard_job(kube, ns, script)
    _failed(kube, ns, job)

    kept = _collect(kube, ns, job, tmp_path)

    assert b"step 100 loss" in kept.read("logs/train-run-1-attempt-1.log"), kept.why("volume")
    assert "crash-report.json" in kept.items and "snapshot/env.json" in kept.items
    assert len(kept.json("checkpoints.json")["files"]) == 3000


def test_a_flood_of_files_and_a_log_over_its_share_cost_the_rest_of_the_evidence_nothing(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    script = ("import os, sys\n"
              "ws, ck = os.environ['TRAINGUARD_WORKSPACE'], os.environ['TRAINGUARD_CHECKPOINT_DIR']\n"
              "for folder in (ws + '/coredumps', ck + '/step-000002'):\n"
              "    os.makedirs(folder, exist_ok=True)\n"
              "    for i in range(5300):\n"
              "        os.close(os.open(folder + '/core.%06d' % i, os.O_CREAT | os.O_WRONLY, 0o600))\n"
              "for _ in range(2048):\n"
              "    sys.stdout.write('step 1 loss 0.5 ' + 'x' * 1000 + '\\n')\n"
              "print('TypeError: unsupported operand', flush=True)\n"
              "raise SystemExit(1)\n")
    job = trainguard_job(kube, ns, script)
    _failed(kube, ns, job)
    store = LocalEvidenceStore(tmp_path / "evidence")

    manifest = within(240, lambda: collect_kubernetes_evidence(
        kube, ns, job, "run-1", 1, store, kept_dir=tmp_path / "triage", copy_budget_bytes=4 * 1024 * 1024,
        collector_timeout_seconds=120), "collection to end")

    kept = Kept(store, manifest)
    assert "crash-report.json" in kept.items and "snapshot/env.json" in kept.items, kept.why("volume")
    log = kept.read("logs/train-run-1-attempt-1.log")
    assert log.startswith(b"step 1 loss") and len(log) == 1024 * 1024  # a quarter of the budget, not left out
    assert "share of the copy budget" in kept.why("logs/train-run-1-attempt-1.log (cut)")
    assert len(kept.names("coredumps/")) == 5000
    stopped = [miss.reason for miss in manifest.missing if "the listing stops at 5000 entries" in miss.reason]
    assert stopped and "300 entries from core.005000 on not listed" in stopped[0], stopped
    assert kept.json("checkpoints.json")["left_out"] == 301  # the folder step-000002 is an entry too
