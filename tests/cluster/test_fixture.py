"""The fixture and command line: a cluster starts fast, speaks through its kubeconfig, and takes
its container processes with it when it stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from processes import alive
from kubernetes import client, config

import kubesim
from kubesim.config import NodeSpec, SimConfig
from waiting import wait_for

_PIDFILE_SCRIPT = ("import os, sys, time\n"
                   "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                   "time.sleep(120)\n")


def test_a_started_cluster_serves_its_kubeconfig_and_exits_cleanly(tmp_path: Path) -> None:
    # How fast it starts is measured by benchmarks/kubesim_startup.py, not asserted here.
    with kubesim.run(root=tmp_path) as sim:
        core = client.CoreV1Api(config.new_client_from_config(str(sim.kubeconfig)))
        names = [n.metadata.name for n in core.list_namespace().items]
    assert {"default", "kube-system"} <= set(names)
    assert "fixture: server exited with 0" in (tmp_path / "kubesim.log").read_text()


def test_stopping_the_cluster_ends_its_container_processes(tmp_path: Path) -> None:
    pidfile = tmp_path / "container.pid"
    with kubesim.run(root=tmp_path / "sim", time_scale=0.02) as sim:
        core = client.CoreV1Api(config.new_client_from_config(str(sim.kubeconfig)))
        core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {
            "restartPolicy": "Never", "containers": [{
                "name": "main", "image": "python:3.11",
                "command": [sys.executable, "-c", _PIDFILE_SCRIPT, str(pidfile)]}]}})
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), 15, "the container to start")
        pid = int(pidfile.read_text())
        assert alive(pid)
    wait_for(lambda: not alive(pid), 5, f"container process {pid} to end with the cluster")


def test_a_temporary_root_is_removed_at_the_end() -> None:
    with kubesim.run() as sim:
        root = Path(sim.root)
        assert (root / "kubeconfig").exists()
    assert not root.exists()


def test_config_round_trips_through_json(tmp_path: Path) -> None:
    original = SimConfig(root=tmp_path, nodes=(NodeSpec("gpu-1", gpus=2, labels={"a": "b"},
                                                        taints=({"key": "k", "value": "v",
                                                                 "effect": "NoSchedule"},)),),
                         images={"ghcr.io/*": kubesim.HostPython(sys.executable),
                                 "busybox:*": kubesim.Host()}, time_scale=0.1, history=50, grace_scale=1.0)
    assert SimConfig.from_json(original.to_json()) == original


def test_grace_periods_follow_their_own_scale_where_one_is_given(tmp_path: Path) -> None:
    from kubesim.kubelet import MIN_TERMINATION_GRACE_SECONDS, Kubelet

    def grace(config: SimConfig, seconds: float) -> float:
        kubelet = Kubelet.__new__(Kubelet)  # only its config is read here
        kubelet.config = config
        return kubelet.termination_grace(seconds)

    assert grace(SimConfig(root=tmp_path, time_scale=0.02), 100) == 2.0
    assert grace(SimConfig(root=tmp_path, time_scale=0.02), 1) == MIN_TERMINATION_GRACE_SECONDS
    assert grace(SimConfig(root=tmp_path, time_scale=0.02, grace_scale=1.0), 35) == 35.0  # a real node's
    assert grace(SimConfig(root=tmp_path, time_scale=0.02, grace_scale=1.0), 0) == 0.0
    with pytest.raises(ValueError, match="grace_scale: 0 must be a number above 0"):
        SimConfig(root=tmp_path, grace_scale=0)


def test_command_line_without_root_says_what_is_missing() -> None:
    done = subprocess.run([sys.executable, "-m", "kubesim", "serve"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": "tests"}, timeout=30)
    assert done.returncode == 2
    assert "serve needs --root DIR (or --config FILE)" in done.stderr


@pytest.mark.parametrize("spec", ["gpu-1:x", ":2"])
def test_command_line_rejects_a_malformed_node(spec: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kubesim", "serve", "--root", "/tmp/x",
                           "--node", spec], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": "tests"}, timeout=30)
    assert done.returncode == 2 and "use NAME or NAME:GPUS" in done.stderr


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": ["node-1"]}, "nodes: 'node-1' is not a NodeSpec; use kubesim.Node(name"),
    ({"images": {"x:*": sys.executable}}, "images['x:*']: "),
    ({"time_scale": 0}, "time_scale: 0 must be a number above 0"),
])
def test_bad_configuration_is_refused_before_anything_starts(tmp_path: Path, kwargs: dict,
                                                             message: str) -> None:
    with pytest.raises(ValueError) as err:
        with kubesim.run(root=tmp_path, **kwargs):
            pass
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "kubesim.json").exists()
