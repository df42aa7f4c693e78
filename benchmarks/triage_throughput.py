"""Triage scan throughput against GNU grep over the same patterns and the same log.

Generates a realistic training log (progress lines from several ranks, CRI prefixes, warnings,
NCCL chatter, one crash with its consequences two thirds of the way in), then times, on the same
warm file: trainguard's classify (in a child process that reports its own peak RSS, VmHWM, as it
exits) and ``grep -E -f PATTERNS`` with every rule's log pattern translated to ERE. Wall-clock and
CPU seconds (user + system, from wait4) are both reported: on a shared machine the CPU ratio is
the steadier of the two.

Three shapes of log are measured, because the cost of a scan can grow with the lines that match:
``quiet`` (almost no line matches a pattern), and noisy logs where about 5 % and 20 % of the lines
match one: checkpoint saves, retried hub and bucket requests logged as warnings, c10d socket
warnings and NCCL INFO connection retries, as real multi-rank runs print them.

    .venv/bin/python benchmarks/triage_throughput.py              # 1 GiB of each shape
    .venv/bin/python benchmarks/triage_throughput.py --size-mib 64 --noise 0.05
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
from trainguard.core.triage.engines import prefilter_source  # noqa: E402

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

# Lines that match a rule pattern without being a failure (each checked against the patterns by
# the benchmark before it runs): what noisy but healthy runs print.
NOISE = (
    "{ts} stdout F [rank{r}]: Saving model checkpoint to /out/run-7/checkpoint-{step}\n",
    "{ts} stdout F [rank{r}]: [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] Checkpoint "
    "global_step{step} is ready now!\n",
    "{ts} stdout F [rank{r}]: checkpoint saved to /ckpt/run-7/step_{step}.pt\n",
    "{ts} stderr F h-{r}:1234:5678 [{r}] NCCL INFO Call to connect returned Connection refused, "
    "retrying\n",
    "{ts} stderr F [rank{r}]:[W socket.cpp:663] [c10d] The client socket has failed to connect to "
    "[localhost]:29500 (errno: 97 - Address family not supported by protocol).\n",
    "{ts} stderr F [rank{r}]: huggingface_hub.utils._http: WARNING: HTTP Error 429 thrown while "
    "requesting HEAD https://huggingface.co/org/model/resolve/main/config.json Retrying in 1s "
    "[Retry 1/5].\n",
    "{ts} stderr F [rank{r}]: WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None,"
    " read=None, redirect=None, status=None)) after connection broken by 'ReadTimeoutError(\"HTTPS"
    "ConnectionPool(host='s3.amazonaws.com', port=443): Read timed out. (read timeout=10)\")': "
    "/bucket/shard-{step}.tar\n",
    "{ts} stderr F [rank{r}]: wandb: Network error (ReadTimeout), entering retry loop.\n",
    "{ts} stderr F [rank{r}]: /usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:464: "
    "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed "
    "explicitly.\n",
)


def block(first_step: int, ranks: int, noise: float = 0.0) -> str:
    """About 1 MiB of ordinary training output; ``noise`` of the lines match some pattern."""
    out: list[str] = []
    size = 0
    step = first_step
    owed = 0.0
    per_line = noise / (1 - noise)
    while size < 1 << 20:
        for r in range(ranks):
            ts = f"2025-11-29T10:{(step // 60) % 60:02d}:{step % 60:02d}.{step % 999999:06d}123Z"
            out.append(f"{ts} stdout F [rank{r}]: iter {step:>8} | lm loss: {2.5 - (step % 997) / 1e3:.4f}"
                       f" | grad norm: {0.8 + (step % 13) / 50:.3f} | lr: 3.0E-04 | tokens/s: 41233\n")
            size += len(out[-1])
            owed += per_line
            while owed >= 1:
                owed -= 1
                out.append(NOISE[(step * 7 + r) % len(NOISE)].format(ts=ts, r=r, step=step))
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


def generate(path: Path, size_mib: int, ranks: int, noise: float) -> int:
    """Write the log; return the line number of the CUDA OOM, the root cause to be found."""
    crash_at = (size_mib * 2) // 3
    lines = cause = 0
    with path.open("w") as fh:
        for mib in range(size_mib):
            text = block(mib * 1000, ranks, noise)
            fh.write(text)
            lines += text.count("\n")
            if mib == crash_at:
                fh.write(CRASH)
                cause = lines + 4
                lines += CRASH.count("\n")
    return cause


def to_ere(pattern: str) -> str | None:
    """A Python regex as GNU ERE; None where ERE has no equivalent (look-arounds, a flag for a part only)."""
    if re.search(r"\(\?(?:[=!<]|[a-zA-Z]+:)", pattern):
        return None
    pattern = pattern.replace("(?:", "(").replace("(?i)", "")
    return pattern.replace(r"\d", "[0-9]").replace(r"\D", "[^0-9]")


def time_grep(patterns: Path, log: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds for grep to read the whole log, and how many lines it found."""
    start = time.perf_counter()
    # Output to a pipe, not /dev/null: GNU grep detects /dev/null and stops at the first match.
    # -c keeps the pipe small while grep still reads every line.
    child = subprocess.Popen(["grep", "-c", "-E", "-f", str(patterns), str(log)],
                             stdout=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"})
    out = child.stdout.read() if child.stdout else b""
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, int(out or b"0")


# The child reports its own peak: VmHWM of its own /proc/self/status, read as it exits. getrusage's
# ru_maxrss (from wait4) is not the child's own: across a vfork+exec it keeps the parent's peak.
_PEAK_REPORTER = """
import atexit, os, runpy, sys
def _peak():
    with open('/proc/self/status') as fh:
        kib = next(int(l.split()[1]) for l in fh if l.startswith('VmHWM:'))
    os.write(int(os.environ['TRAINGUARD_BENCH_PEAK_FD']), b'%d' % kib)
atexit.register(_peak)
sys.argv = ['trainguard'] + sys.argv[1:]
runpy.run_module('trainguard.cli', run_name='__main__', alter_sys=True)
"""


def time_trainguard(log: Path, engine: str, out: Path) -> dict[str, object]:
    """The whole ``trainguard classify`` process: start-up, rule loading, the scan, the answer."""
    read_end, write_end = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRAINGUARD_BENCH_PEAK_FD": str(write_end)}
    command = [sys.executable, "-c", _PEAK_REPORTER, "classify", "--json", "--exit-code", "1",
               "--engine", engine, str(log)]
    with out.open("wb") as fh:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=fh, env=env, pass_fds=(write_end,))
        os.close(write_end)
        _, status, usage = os.wait4(child.pid, 0)  # its CPU time is its own; its ru_maxrss is not
        child.returncode = 0
        seconds = time.perf_counter() - start
    with os.fdopen(read_end, "rb") as peak:
        reported = peak.read()
    if status != 0 or not reported:
        raise SystemExit(f"trainguard classify failed with status {status}")
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "max_rss_kib": int(reported),
            "diagnosis": json.loads(out.read_text())}


def measure(tmp: Path, patterns: Path, args: argparse.Namespace, noise: float) -> dict[str, object]:
    """Generate one shape of log, then time grep and trainguard on it, interleaved."""
    log = tmp / "train.log"
    started = time.perf_counter()
    cause = generate(log, args.size_mib, args.ranks, noise)
    size = log.stat().st_size
    lines = int(subprocess.run(["wc", "-l", str(log)], capture_output=True, text=True,
                               check=True).stdout.split()[0])
    print(f"noise {noise:.0%}: generated {size / 2**20:.0f} MiB in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
    grep_s, grep_cpu, ours = [], [], []
    matched = 0
    for _ in range(args.rounds):
        seconds, cpu, matched = time_grep(patterns, log)
        grep_s.append(seconds)
        grep_cpu.append(cpu)
        ours.append(time_trainguard(log, args.engine, tmp / "answer.json"))
    best = min(ours, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
    ours_s = float(best["seconds"])  # type: ignore[arg-type]
    log.unlink()
    return {
        "noise": noise, "log_mib": round(size / 2**20),
        "lines_matching_a_pattern": round(matched / lines, 3),
        "grep_seconds": round(min(grep_s), 3), "trainguard_seconds": round(ours_s, 3),
        "ratio_grep_over_trainguard": round(min(grep_s) / ours_s, 2),
        "trainguard_mib_per_s": round(size / 2**20 / ours_s),
        # CPU seconds (user + system) say the same less noisily on a shared machine.
        "grep_cpu_seconds": round(min(grep_cpu), 3),
        "trainguard_cpu_seconds": round(min(float(r["cpu_seconds"]) for r in ours), 3),  # type: ignore[arg-type]
        "cpu_ratio_grep_over_trainguard": round(
            min(grep_cpu) / min(float(r["cpu_seconds"]) for r in ours), 2),  # type: ignore[arg-type]
        "load_average": round(os.getloadavg()[0], 1),
        "trainguard_peak_rss_mib": round(max(int(r["max_rss_kib"]) for r in ours) / 1024, 1),  # type: ignore[call-overload]
        "diagnosis": {k: best["diagnosis"][k] for k in ("category", "rule_id", "line_number", "rank")},  # type: ignore[index]
        "found_the_cause": all(r["diagnosis"]["line_number"] == cause  # type: ignore[index]
                               and r["diagnosis"]["category"] == "cuda_oom" for r in ours),  # type: ignore[index]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="best of N for each tool")
    parser.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "re"])
    parser.add_argument("--noise", type=float, action="append",
                        help="fraction of lines that match a pattern (repeatable); "
                             "default: 0, 0.05 and 0.2")
    args = parser.parse_args()
    rules = triage.load_rules()
    # grep gets every pattern a rule holds, context patterns included, as it always has.
    # They are the rules' own patterns, not the looser ones trainguard's engine looks for.
    sources = [prefilter_source(r.pattern).decode() for rule in rules.rules for r in rule.log_res] + [
        prefilter_source(r.pattern).decode() for rule in rules.rules for r in rule.context_res]
    ere = [e for e in (to_ere(s) for s in sources) if e is not None]
    print(f"{len(ere)} of {len(sources)} patterns expressible in ERE for grep", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        patterns = Path(tmp) / "PATTERNS"
        patterns.write_text("\n".join(ere) + "\n")
        shapes = [measure(Path(tmp), patterns, args, noise)
                  for noise in (args.noise or [0.0, 0.05, 0.2])]
    report = {"patterns": len(sources), "engine": args.engine, "shapes": shapes,
              "worst_ratio_grep_over_trainguard": min(
                  float(s["ratio_grep_over_trainguard"]) for s in shapes),  # type: ignore[arg-type]
              "cause_found_in_every_shape": all(s["found_the_cause"] for s in shapes)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
