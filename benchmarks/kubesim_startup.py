"""How long kubesim takes to start (until /readyz answers and a client can list namespaces).

Baseline in the same run: starting a bare Python interpreter that imports aiohttp, the floor any
subprocess-based server pays. Usage: .venv/bin/python benchmarks/kubesim_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import kubesim  # noqa: E402
from kubernetes import client, config  # noqa: E402


def time_kubesim() -> float:
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        with kubesim.run(root=Path(root)) as sim:
            core = client.CoreV1Api(config.new_client_from_config(str(sim.kubeconfig)))
            core.list_namespace()
            return time.perf_counter() - started


def time_bare_interpreter() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import aiohttp"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ours = [time_kubesim() for _ in range(args.runs)]
    bare = [time_bare_interpreter() for _ in range(args.runs)]
    o, b = statistics.median(ours), statistics.median(bare)
    print(f"kubesim start to first answered request: median {o:.2f} s (goal < 2 s)")
    print(f"bare interpreter importing aiohttp:      median {b:.2f} s")
    print(f"ratio: {o / b:.1f}x")


if __name__ == "__main__":
    main()
