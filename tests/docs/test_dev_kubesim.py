"""`./dev kubesim-run` and `./dev kubesim` as a user drives them, in a fresh copy of the checkout.

A Ctrl-C is what a terminal sends: SIGINT to the foreground process group, here the session the
`./dev` process leads. kubesim, Prefect's temporary server and the training containers are real
(the commands run in kubesim's pods as processes of this host).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkout_copy import copy_checkout, stop_kubesim, user_env
from processes import alive
from waiting import wait_for

# Attempt 1 trains until it is stopped; a later attempt (a resume) finishes at once.
STOPPABLE = """name: stoppable
command: [python3, -c, "import os, time; print('training step 1', flush=True); time.sleep(600 if os.environ['TRAINGUARD_ATTEMPT'] == '1' else 0)"]
"""
QUICK = """name: quick
command: [python3, -c, "print('done', flush=True)"]
"""


class Dev:
    """One `./dev ...` process in a session of its own, its output gathered as it comes."""

    def __init__(self, checkout: Path, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(["./dev", *args], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for chunk in iter(lambda: self.process.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def ctrl_c(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise AssertionError(f"./dev still running after {timeout:.0f} s; its output:\n{self.output[-4000:]}")
        self._reader.join(10)
        return code


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    checkout = copy_checkout(tmp_path)
    (checkout / "stoppable.yaml").write_text(STOPPABLE)
    (checkout / "quick.yaml").write_text(QUICK)
    env = user_env(tmp_path / "prefect-home")
    try:
        yield checkout, env
    finally:
        stop_kubesim(checkout, env)


def _kubesim_pid(checkout: Path) -> int:
    return int(re.search(r'"pid": (\d+)', (checkout / ".kubesim" / "current").read_text()).group(1))  # type: ignore[union-attr]


def test_ctrl_c_stops_the_run_first_then_kubesim_and_the_run_resumes(fresh: tuple[Path, dict[str, str]]) -> None:
    checkout, env = fresh
    run = Dev(checkout, env, "kubesim-run", "stoppable.yaml")
    wait_for(lambda: "training step 1" in run.output, timeout=300, what="the training command's first line")
    server = _kubesim_pid(checkout)
    run.ctrl_c()
    assert run.wait(180) == 130, run.output
    out = run.output
    assert "user_cancelled" in out and "Stopped: trainguard run was interrupted (Ctrl-C)" in out
    resume = re.search(r"resume with: trainguard run stoppable.yaml --resume (\S+) --backend "
                       r"trainguard-kubernetes-job-backend/cli-\w+", out)
    assert resume, out
    # kubesim outlived the Ctrl-C, and was stopped only after the run had printed its ending
    assert out.index("resume with:") < out.index("kubesim: stopped")
    assert not alive(server)
    run_id = resume.group(1)
    kept = checkout / "trainguard-data" / "evidence" / "runs" / run_id / "attempt-1"
    assert (kept / "manifest.json").is_file() and (kept / "kubernetes" / "job.json").is_file()
    # the README's way on: a new kubesim on the same folder, the run's volumes still there
    again = Dev(checkout, env, "kubesim-run", "stoppable.yaml", "--resume", run_id)
    assert again.wait(300) == 0, again.output
    assert f"{run_id} succeeded on attempt 2" in again.output


def test_keep_leaves_kubesim_for_kubectl_and_the_verbs(fresh: tuple[Path, dict[str, str]]) -> None:
    checkout, env = fresh
    run = Dev(checkout, env, "kubesim-run", "quick.yaml", "--keep")
    assert run.wait(300) == 0, run.output
    line = re.search(r"kubesim: still running: export (KUBECONFIG=\S+);", run.output)
    assert line, run.output
    kube = {**env, "KUBECONFIG": line.group(1).split("=", 1)[1]}
    assert alive(_kubesim_pid(checkout))

    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["./dev", "kubesim", *args], cwd=checkout, env=kube, capture_output=True,
                              text=True, timeout=120)

    def kubectl(*args: str) -> str:
        return subprocess.run(["kubectl", *args], env=kube, capture_output=True, text=True, check=True,
                              timeout=60).stdout

    assert dev("status").stdout.strip() == line.group(1)
    subprocess.run(["kubectl", "apply", "-f", "-"], env=kube, check=True, capture_output=True, text=True, input=(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  restartPolicy: Never\n  containers:\n"
        "  - {name: main, image: trainguard-checkout:local, command: [python3, -c, 'import time; time.sleep(600)']}\n"))
    wait_for(lambda: kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}") == "Running",
             timeout=60, what="the pod running")
    assert "evicted pod default/sleeper" in dev("evict", "sleeper").stdout
    wait_for(lambda: kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.reason}") == "Evicted",
             timeout=60, what="the pod evicted")
    assert "crashed" in dev("fail-node", "gpu-node-2").stdout
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    wait_for(lambda: kubectl("get", "node", "gpu-node-2", "-o", ready) != "True", timeout=60,
             what="gpu-node-2 NotReady")
    dev("heal-node", "gpu-node-2")
    wait_for(lambda: kubectl("get", "node", "gpu-node-2", "-o", ready) == "True", timeout=60,
             what="gpu-node-2 Ready again")
    unknown = dev("evict", "nope")
    assert unknown.returncode == 1 and 'pods "nope" not found' in unknown.stderr
    server = _kubesim_pid(checkout)
    assert "kubesim: stopped" in dev("stop").stdout and not alive(server)
    gone = dev("status")
    assert gone.returncode == 1 and "none running" in gone.stdout
