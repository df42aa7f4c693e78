"""Triage scan throughput against GNU grep over the same patterns and the same log.

Generates a realistic training log (progress lines from several ranks, CRI prefixes, warnings,
NCCL chatter, one crash with its consequences two thirds of the way in), then times, on the same
warm file: trainguard's classify (in a child process, reporting its peak RSS) and
``grep -E -f PATTERNS`` with every rule's log pattern translated to ERE.

    .venv/bin/python benchmarks/triage_throughput.py              # 1 GiB
    .venv/bin/python benchmarks/triage_throughput.py --size-mib 64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainguard.core import triage  # noqa: E402
from trainguard.core.triage.scan import patterns_of  # noqa: E402

CRASH = (
    "[rank3]: Traceback (most recent call last):\n"
    '[rank3]:   File "/workspace/train.py", line 412, in <module>\n'
    "[rank3]:     loss.backward()\n"
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 3 has a "
    "total capacity of 79.15 GiB of which 1.02 GiB is free.\n"
    + "".join(
        f"[rank{r}]:[E1129 10:31:0{r}.123456 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=80812, OpType=ALLREDUCE, NumelIn=9801523, "
        "NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n"
        for r in (0, 1, 2, 4, 5, 6, 7))
)

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from trainguard.core import triage
rules = triage.load_rules()
triage.classify(triage.Signals(exit_code=1, log=b"warm up\n"), rules=rules, engine=sys.argv[2])
start = time.perf_counter()
d = triage.classify(triage.Signals(exit_code=1, log=Path(sys.argv[1])), rules=rules, engine=sys.argv[2])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "diagnosis": d.to_dict() if d else None}))
"""


def block(first_step: int, ranks: int) -> str:
    """About 1 MiB of ordinary training output."""
    out: list[str] = []
    size = 0
    step = first_step
    while size < 1 << 20:
        for r in range(ranks):
            ts = f"2025-11-29T10:{(step // 60) % 60:02d}:{step % 60:02d}.{step % 999999:06d}123Z"
            out.append(f"{ts} stdout F [rank{r}]: iter {step:>8} | lm loss: {2.5 - (step % 997) / 1e3:.4f}"
                       f" | grad norm: {0.8 + (step % 13) / 50:.3f} | lr: 3.0E-04 | tokens/s: 41233\n")
            size += len(out[-1])
        if step % 50 == 0:
            out.append(f"h-{step % 8}:1234:5678 [{step % 8}] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n")
        if step % 200 == 0:
            out.append("/usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:464: UserWarning: "
                       "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.\n")
        if step % 500 == 0:
            out.append("h-1:1234:5678 [1] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n")
        step += 1
    return "".join(out)


def generate(path: Path, size_mib: int, ranks: int) -> None:
    crash_at = (size_mib * 2) // 3
    with path.open("w") as fh:
        for mib in range(size_mib):
            fh.write(block(mib * 1000, ranks))
            if mib == crash_at:
                fh.write(CRASH)


def to_ere(pattern: str) -> str | None:
    """A Python regex as GNU ERE; None where ERE has no equivalent (look-arounds)."""
    if re.search(r"\(\?[=!<]", pattern):
        return None
    pattern = pattern.replace("(?:", "(").replace("(?i)", "")
    return pattern.replace(r"\d", "[0-9]").replace(r"\D", "[^0-9]")


def time_grep(patterns: Path, log: Path) -> float:
    start = time.perf_counter()
    # Output to a pipe, not /dev/null: GNU grep detects /dev/null and stops at the first match.
    # -c keeps the pipe small while grep still reads every line.
    subprocess.run(["grep", "-c", "-E", "-f", str(patterns), str(log)], stdout=subprocess.PIPE,
                   env={**os.environ, "LC_ALL": "C"}, check=False)
    return time.perf_counter() - start


def time_trainguard(log: Path, engine: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(log), engine], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="best of N for each tool")
    parser.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "re"])
    args = parser.parse_args()
    rules = triage.load_rules()
    sources = [p.prefilter.decode() for p in patterns_of(rules.rules)]
    ere = [e for e in (to_ere(s) for s in sources) if e is not None]
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        log, patterns = Path(tmp) / "train.log", Path(tmp) / "PATTERNS"
        patterns.write_text("\n".join(ere) + "\n")
        started = time.perf_counter()
        generate(log, args.size_mib, args.ranks)
        size = log.stat().st_size
        print(f"generated {size / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s; "
              f"{len(ere)} of {len(sources)} patterns expressible in ERE for grep")
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        grep_s, ours = [], []
        for _ in range(args.rounds):
            grep_s.append(time_grep(patterns, log))
            ours.append(time_trainguard(log, args.engine))
        best = min(ours, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
        ours_s = float(best["seconds"])  # type: ignore[arg-type]
        report = {
            "log_mib": round(size / 2**20), "patterns": len(sources), "engine": args.engine,
            "grep_seconds": round(min(grep_s), 3), "trainguard_seconds": round(ours_s, 3),
            "ratio_grep_over_trainguard": round(min(grep_s) / ours_s, 2),
            "trainguard_mib_per_s": round(size / 2**20 / ours_s),
            "trainguard_peak_rss_mib": round(max(int(r["max_rss_kib"]) for r in ours) / 1024, 1),  # type: ignore[call-overload]
            "diagnosis": {k: best["diagnosis"][k] for k in ("category", "rule_id", "line_number", "rank")},  # type: ignore[index]
        }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
