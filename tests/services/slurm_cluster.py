"""A throwaway two-node Slurm for the tests: munged, slurmctld, two slurmd and accounting on loopback, under one folder.

Nothing system-wide is read or written: the configuration, munge key and socket, state, spool, pid
and log files and the accounting database live under the folder given, and every command reaches
this cluster through `SLURM_CONF`. The node is this machine, tracked with `proctrack/linuxproc` and
`task/none` (no cgroups needed), as root. Jobs and steps are accounted by slurmdbd over MariaDB
(tests/services/slurm_accounting.py), so `sacct` answers; job completion records also go to `jobcomp/filetxt`.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from services import slurm_accounting as accounting

DAEMONS = ("mariadbd", "munged", "slurmdbd", "slurmctld", "slurmd", "slurmd-2")  # in starting order
MULTI = "multi"  # the partition of both nodes; the default one holds the first node alone
URGENT = "urgent"  # the first node again, one PriorityTier up: its jobs preempt the default partition's
GRACE_SECONDS = 45  # the default partition's GraceTime: a preempted job's end moves to now + this


# Settings that do not depend on the folder or the ports: root daemons, processes tracked without
# cgroups, completion records also to a text file. Memory: see `memory_enforcement`.
_STATIC = (
    "SlurmUser=root",
    "SlurmdUser=root",
    "AuthType=auth/munge",
    "CredType=cred/munge",
    "SlurmctldDebug=info",
    "SlurmdDebug=info",
    "ProctrackType=proctrack/linuxproc",
    "JobAcctGatherType=jobacct_gather/linux",
    "JobAcctGatherFrequency=1",
    "JobCompType=jobcomp/filetxt",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_Core_Memory",
    "SchedulerType=sched/backfill",
    "ReturnToService=1",  # a node an admin set DOWN stays down until resumed
    "MaxJobCount=10000",
    "MinJobAge=600",
    "KillWait=5",
    "InactiveLimit=0",
    "SlurmdTimeout=30",
    "MessageTimeout=10",
    "MpiDefault=none",
    "SwitchType=switch/none",
    "LaunchParameters=use_interactive_step",
    # Preemption by partition tier alone: a job of a higher PriorityTier partition cancels, after the
    # lower one's GraceTime, the jobs it needs the node of. Jobs of one tier never preempt each other.
    "PreemptType=preempt/partition_prio",
    "PreemptMode=CANCEL",
)


# The daemons' ports come from below the kernel's ephemeral range (ip_local_port_range starts at
# 32768): the cluster starts beside the Prefect server and other services that bind port 0, and a
# port handed out by bind(0) and released could otherwise be taken by a daemon before its owner binds it.
# Below 24000 are the jobs' rendezvous ports (see `first_job_id`).
_PRIVATE_PORTS = range(24000, 32000)
_handed_out: set[int] = set()  # never the same port twice in one process, bound yet or not


def free_port() -> int:
    """A loopback port nobody listens on now, outside the ephemeral range."""
    for _ in range(100):
        port = random.choice(_PRIVATE_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port between {_PRIVATE_PORTS.start} and {_PRIVATE_PORTS.stop}")


_JOB_IDS_PER_CLUSTER = 250
_clusters_started = itertools.count()


def first_job_id() -> int:
    """The first job id of a cluster this process starts, apart from every other test cluster's.

    The backend gives a job the rendezvous port 20000 + its id % 20000 (`MASTER_PORT`). Each
    pytest-xdist worker starts clusters of its own, and all of them numbered their jobs from 1, so two
    workers' job 9 listened on port 20009 at once and one failed with EADDRINUSE. Each worker takes
    four blocks of 250 ids in turn: ports 20001 to 23999 for four workers, below the daemons' ports.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    block = (int(worker) if worker.isdigit() else 0) * 4 + next(_clusters_started) % 4
    return 1 + (block % 16) * _JOB_IDS_PER_CLUSTER


def missing_binaries() -> list[str]:
    commands = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")
    return [name for name in commands if not shutil.which(name)] + accounting.missing_binaries()


_MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller, as Slurm's cgroup/v1 uses it


def cgroup_memory_usable() -> bool:
    """Whether this machine lets root make memory cgroups (v1) with a limit: then Slurm can confine jobs."""
    probe = _MEMORY_CGROUP / f"trainguard-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "memory.limit_in_bytes").write_text(str(256 * 2**20))
        return True
    except OSError:
        return False
    finally:
        probe.rmdir()


def memory_enforcement(etc: Path) -> list[str]:
    """slurm.conf's lines for memory limits: the kernel's cgroup OOM killer where cgroups allow it
    (steps end OUT_OF_MEMORY), else jobacct_gather's polling (OverMemoryKill, steps end FAILED)."""
    if not cgroup_memory_usable():
        return ["TaskPlugin=task/none", "JobAcctGatherParams=OverMemoryKill"]
    (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainRAMSpace=yes\n"
                                     "ConstrainSwapSpace=no\nConstrainCores=no\nConstrainDevices=no\n")
    return ["TaskPlugin=task/cgroup"]


def remove_cgroups(node: str) -> None:
    """slurmd leaves its `slurm_NODE` cgroups behind, empty of processes: remove them, deepest first."""
    for top in Path("/sys/fs/cgroup").glob(f"*/slurm_{node}"):
        folders = [p for p in top.rglob("*") if p.is_dir()] + [top]
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:
                pass  # still holds a process: not ours to force


def _memory_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as handle:
        total_kb = int(next(line for line in handle if line.startswith("MemTotal:")).split()[1])
    return max(512, total_kb // 1024 - 1024)  # a little under the machine's, as slurmd checks it


@dataclass
class SlurmCluster:
    """Two nodes on this machine, each its own slurmd on its own port: the default partition (`debug`)
    holds the first alone, so single-node jobs always land there; `multi` holds both, for jobs of
    several nodes. Private ports; `env` points commands at it."""

    root: Path
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    partition: str = "debug"
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    db: accounting.Accounting | None = None
    memory_lines: list[str] = field(default_factory=list)

    @property
    def memory_cgroups(self) -> bool:
        """Whether jobs' memory is confined by cgroups (else by jobacct_gather's polling)."""
        return "TaskPlugin=task/cgroup" in self.memory_lines

    @property
    def second_node(self) -> str:
        return f"{self.node}-2"

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def jobcomp_log(self) -> Path:
        return self.root / "log" / "jobcomp.txt"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("etc", "state", "spool", "run", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in (self.node, self.second_node):
            (self.root / "spool" / node).mkdir(exist_ok=True)
        ctl_port, node_port = free_port(), free_port()
        r = self.root
        self.memory_lines = memory_enforcement(r / "etc")
        self.db = accounting.Accounting(r / "db", mariadb_port=free_port(), dbd_port=free_port())
        self.db.write_dbd_conf(r / "etc", self.munge_socket, r / "log", r / "run")
        self.conf.write_text("\n".join([
            "ClusterName=trainguard-test",
            f"FirstJobId={first_job_id()}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            f"SlurmdPort={node_port}",
            *_STATIC,
            *self.memory_lines,
            *self.db.slurm_conf_lines(self.munge_socket),
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            f"PlugStackConfig={r}/etc/plugstack.conf",
            f"JobCompLoc={self.jobcomp_log}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={_memory_mb()} State=UNKNOWN",
            f"NodeName={self.second_node} NodeAddr=127.0.0.1 Port={free_port()} CPUs={os.cpu_count() or 1} "
            f"RealMemory={_memory_mb()} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO "
            f"PriorityTier=1 GraceTime={GRACE_SECONDS}",
            f"PartitionName={MULTI} Nodes={self.node},{self.second_node} MaxTime=INFINITE State=UP OverSubscribe=NO "
            "PriorityTier=1",
            f"PartitionName={URGENT} Nodes={self.node} MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2 "
            "PreemptMode=OFF",
            "",
        ]))
        (self.root / "etc" / "plugstack.conf").write_text("")

    def _munge_key(self) -> Path:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "munge").chmod(0o700)
        return key

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.stdout").open("ab")
        self.processes[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start(self) -> None:
        """Write the configuration and start the daemons in the foreground of their own sessions.

        MariaDB and munged start side by side; slurmdbd once both answer; slurmctld once slurmdbd
        listens (it registers the cluster there first); slurmd last.
        """
        self.write_config()
        db = self.db
        assert db is not None
        self._spawn("mariadbd", db.mariadb_argv())
        m = self.root / "munge"
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={self._munge_key()}", f"--socket={self.munge_socket}",
            f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed",
        ])
        self._wait_for_path(self.munge_socket, "munged's socket")
        db.wait_ready("MariaDB", db.mariadb_port, self._check_alive)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        db.wait_ready("slurmdbd", db.dbd_port, self._check_alive)
        self.start_controller()
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._spawn("slurmd-2", ["slurmd", "-D", "-f", str(self.conf), "-N", self.second_node])

    def start_controller(self) -> None:
        """Start slurmctld; it recovers its jobs from the state folder when started again."""
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])

    def stop_controller(self) -> None:
        """Stop slurmctld alone (jobs keep running under slurmd); `restart_controller` brings it back."""
        self._stop("slurmctld")
        del self.processes["slurmctld"]

    def restart_controller(self, timeout: float = 60.0) -> None:
        """Start slurmctld again if it was stopped, and wait until it answers."""
        if "slurmctld" not in self.processes:
            self.start_controller()
        deadline = time.monotonic() + timeout
        while " is UP" not in self.run("scontrol", "ping", check=False).stdout:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld did not answer within {timeout:g}s of its restart")
            time.sleep(0.1)

    def _wait_for_path(self, path: Path, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not appear at {path} within {timeout:g}s")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                log = (self.root / "log" / f"{name}.stdout").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}: {log}")

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def node_state(self) -> str:
        """The node's state as sinfo prints it (idle, alloc, down*, ...), or '' while unreachable."""
        self._check_alive()
        # scontrol's own word on the node: sinfo's node-oriented view was seen to say "mixed" for a minute
        # after a job of both nodes had ended, while the node was idle with nothing allocated
        done = self.run("scontrol", "show", "node", self.node, check=False)
        state = next((w.removeprefix("State=") for w in done.stdout.split() if w.startswith("State=")), "")
        if done.returncode != 0 or not state:
            return ""
        base, *flags = state.lower().split("+")
        return "drain" if "drain" in flags else base

    def set_node(self, state: str, reason: str = "") -> None:
        argv = ["scontrol", "update", f"nodename={self.node}", f"state={state}"]
        self.run(*argv, *([f"reason={reason}"] if reason else []))

    def jobs(self) -> list[str]:
        """Ids of the jobs the cluster still holds queued or running."""
        done = self.run("squeue", "--noheader", "--format=%i", check=False)
        return done.stdout.split() if done.returncode == 0 else []

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons (slurmd first), each by its own process."""
        if self.processes.get("slurmctld") is not None and self.processes["slurmctld"].poll() is None:
            self.run("scancel", f"--user={os.getuid()}", check=False)
            deadline = time.monotonic() + 15
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(DAEMONS):
            self._stop(name)
        if self.memory_cgroups:
            remove_cgroups(self.node)
            remove_cgroups(self.second_node)

    def _stop(self, name: str) -> None:
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
