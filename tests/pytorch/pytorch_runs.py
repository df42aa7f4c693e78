"""Real failing PyTorch runs under torchrun: which to run, how, and what each leaves behind.

A scenario is one training script (``scripts/``) run by one torchrun agent per node, with gloo on
the CPU, a chosen fault on a chosen rank, ``TORCHELASTIC_ERROR_FILE`` set for each agent and
``--log-dir DIR --redirects 3 --tee 3``, so that a run leaves what a real job leaves: the
combined output with ``[defaultN]:``/``[rankN]:`` prefixes, each rank's own stdout and stderr
under the log dir, each rank's error file and the agent's copy of its root cause's. Two-node
scenarios start two agents (``--nnodes 2 --node-rank 0|1``) on loopback.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
# A run that hangs waits for a gloo timeout of this many seconds, not the default half hour.
TIMEOUT_SECONDS = 4
RUN_SECONDS = 150


@dataclass(frozen=True)
class Scenario:
    """One real run: a script, its fault, its ranks, and what the evidence allows us to expect.

    ``rank`` is the culprit's global rank, None when only its category can be told from the
    evidence (a hang or a desync: every rank's own error is a lost peer).
    """

    name: str
    script: str
    args: tuple[str, ...]
    category: str
    retryable: bool
    rank: int | None
    nproc: int = 2
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.nproc * self.nodes


@dataclass
class NodeRun:
    """What one torchrun agent left behind."""

    node_rank: int
    returncode: int
    output: bytes  # the agent's combined stdout and stderr
    rank_logs: dict[int, bytes] = field(default_factory=dict)  # global rank -> its own output
    error_files: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (path, JSON)
    agent_error: str | None = None  # the agent's TORCHELASTIC_ERROR_FILE, if it wrote one


@dataclass
class Run:
    scenario: Scenario
    nodes: list[NodeRun]
    seconds: float


def ddp(name: str, fault: str, rank: int | None, category: str, retryable: bool, *,
        culprit: int = 1, step: int = 2, nproc: int = 2, nodes: int = 1) -> Scenario:
    args = ("--fault", fault, "--fault-rank", str(culprit), "--fault-step", str(step),
            "--timeout-seconds", str(TIMEOUT_SECONDS))
    return Scenario(name, "train_ddp.py", args, category, retryable, rank, nproc, nodes)


SCENARIOS = {s.name: s for s in (
    ddp("shape", "shape", 1, "code_error", False),
    ddp("type", "type", 0, "code_error", False, culprit=0),
    ddp("nonfinite", "nonfinite", None, "divergence", False),
    ddp("data", "data", 1, "data_error", False, nproc=3),
    ddp("checkpoint", "checkpoint", 1, "checkpoint_corrupted", True),
    ddp("sigkill", "sigkill", 1, "unknown", True),
    ddp("memory", "memory", 1, "host_oom", False),
    ddp("hang", "hang", None, "nccl_error", True, nproc=3),
    ddp("desync", "desync", None, "nccl_error", True),
    ddp("loader_segfault", "loader_segfault", 0, "native_crash", True, culprit=0),
    ddp("loader_bug", "loader_bug", 1, "code_error", False),
    Scenario("lightning_shape", "train_lightning.py", ("--fault", "shape", "--fault-rank", "1"),
             "code_error", False, 1),
    Scenario("lightning_checkpoint", "train_lightning.py", ("--fault", "checkpoint"),
             "checkpoint_corrupted", True, None),
    ddp("two_nodes_shape", "shape", 3, "code_error", False, culprit=3, nodes=2),
)}
# The matrix recorded for the tests of root_cause across nodes (tests/triage/recorded/): every
# fault kind, with the culprit on either node, at the first training step or a later one.
MATRIX_KINDS = {name: SCENARIOS[name] for name in (
    "shape", "type", "nonfinite", "data", "checkpoint", "sigkill", "memory", "hang", "desync")}


def matrix() -> list[Scenario]:
    out = []
    for kind, base in MATRIX_KINDS.items():
        for culprit in (1, 2):
            for step in (0, 3):
                rank = None if base.rank is None else culprit
                out.append(ddp(f"two_nodes_{kind}_rank{culprit}_step{step}", kind, rank,
                               base.category, base.retryable, culprit=culprit, step=step,
                               nodes=2))
    return out


def master_port() -> int:
    """A free port below Linux's ephemeral range, which gloo's own connections draw from: a port
    the kernel hands out could be taken by another run's connection before the agent binds it."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def run(scenario: Scenario, workdir: Path, python: str = sys.executable) -> Run:
    """Run the scenario's agents side by side and collect what each left behind."""
    started = time.monotonic()
    for attempt in range(3):
        here = workdir / f"attempt{attempt}"
        (here / "data").mkdir(parents=True, exist_ok=True)
        port = master_port()
        with ThreadPoolExecutor(scenario.nodes) as pool:
            nodes = list(pool.map(lambda n: _agent(scenario, here, python, n, port),
                                  range(scenario.nodes)))
        # Another process took the master port between our check and the agent's bind.
        if not any(b"EADDRINUSE" in n.output for n in nodes):
            break
    return Run(scenario, nodes, time.monotonic() - started)


def _agent(scenario: Scenario, workdir: Path, python: str, node: int, port: int) -> NodeRun:
    here = workdir / f"node{node}"
    logs = here / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    agent_error = here / "agent-error.json"
    where = (["--standalone"] if scenario.nodes == 1 else
             ["--nnodes", str(scenario.nodes), "--node-rank", str(node),
              "--master-addr", "127.0.0.1", "--master-port", str(port)])
    command = [python, "-m", "torch.distributed.run", *where,
               "--nproc-per-node", str(scenario.nproc), "--log-dir", str(logs),
               "--redirects", "3", "--tee", "3", str(SCRIPTS / scenario.script),
               *scenario.args, "--workdir", str(workdir)]
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(agent_error), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    agent = subprocess.Popen(command, cwd=here, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    (here / "agent.pid").write_text(str(agent.pid))
    try:
        output, _ = agent.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        output = _stop(agent)
    if node == 0 and b"EADDRINUSE" in output and scenario.nodes > 1:
        _stop_peers(workdir, scenario)
    result = NodeRun(node, agent.returncode, output)
    first = node * scenario.nproc
    for folder in sorted(logs.glob("*/attempt_*/*")):
        rank = first + int(folder.name)
        result.rank_logs[rank] = b"".join(
            (folder / name).read_bytes() for name in ("stdout.log", "stderr.log")
            if (folder / name).is_file())
        error = folder / "error.json"
        if error.is_file():
            result.error_files[rank] = (str(error), error.read_text())
    if agent_error.is_file():
        result.agent_error = agent_error.read_text()
    return result


def _stop(agent: subprocess.Popen[bytes]) -> bytes:
    """Stop an agent that overran: SIGTERM makes torchrun stop its workers (each runs in a
    session of its own) before it exits; SIGKILL only if it does not."""
    agent.terminate()
    try:
        output, _ = agent.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        agent.kill()
        output, _ = agent.communicate()
    return output


def _stop_peers(workdir: Path, scenario: Scenario) -> None:
    """Stop the other agents of a run whose master could not bind its port: they would wait
    for it until their rendezvous timed out (they have no workers yet)."""
    for number in range(1, scenario.nodes):
        try:
            os.kill(int((workdir / f"node{number}" / "agent.pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
