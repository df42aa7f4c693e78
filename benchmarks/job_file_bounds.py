"""What reading a job's files within their bounds costs, on the worst inputs a job can leave.

Each case runs in a process of its own, twice: untimed under tracemalloc for the peak of what Python
allocated, timed without it (with the process's maximum RSS); median of ``--runs``:

- ``amplified index``: `stacks/index.json` naming one 4 MiB py-spy file for 4,096 ranks, read by
  `rankstacks.read_stacks` (before the bounds: the file parsed 4,096 times, ~40 MB of frames each);
- ``budget``: 16 distinct 4 MiB stack files, the 64 MiB a attempt's stacks may take;
- ``deep error file``: torchelastic's error file nested 100,000 deep, by `parse_error_file`;
- ``4096-rank table``: the stacks' table of 4,096 ranks recorded absent, as the summary carries it
  (bytes of the summary's JSON) against the whole table;
- ``before``, with ``--before``: the amplified index read the old way (every name parsed), for
  ``--before-names`` names only, so the figure per name can be scaled.

    .venv/bin/python benchmarks/job_file_bounds.py [--runs 3] [--before --before-names 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backends"))

from stackfiles import py_spy_dump, write_index  # noqa: E402

CASE = textwrap.dedent("""
    import json, resource, sys, time, tracemalloc
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from trainguard.core.backends import rankstacks
    from trainguard.core.triage import errorfile, hangs
    from trainguard.core import attempt
    case, folder, traced = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "traced"
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    extra = None
    if case in ("amplified", "budget"):
        extra = sum(1 for s in rankstacks.read_stacks(folder) if s.threads)
    elif case == "before":
        index = json.loads((folder / "stacks" / "index.json").read_text())
        kept = [hangs.parse_py_spy((folder / "stacks" / entry["file"]).read_text())  # as read_stacks kept them
                for rank, entry in index["ranks"].items()]
        extra = len(kept)
    elif case == "deep":
        extra = errorfile.parse_error_file("[" * 100_000)
    elif case == "table":
        rows = [hangs.RankStacks(r, node=f"gpu-{{r // 8}}", absent="the process ended " + "z" * 200) for r in range(4096)]
        verdict = hangs.odd_ones_out(rows)
        extra = [len(json.dumps(attempt.stacks_table(verdict, attempt.STACK_ROWS))),
                 len(json.dumps(attempt.stacks_table(verdict)))]
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    print(json.dumps({{"seconds": seconds, "peak": peak,
                      "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "extra": extra}}))
""")


def _run(case: str, folder: Path) -> dict[str, object]:
    """The case's time untraced (tracemalloc slows every allocation), its peak traced."""
    result = {}
    for mode in ("untraced", "traced"):
        done = subprocess.run([sys.executable, "-c", CASE.format(root=str(ROOT)), case, str(folder), mode],
                              capture_output=True, text=True, check=True, timeout=3600)
        result[mode] = json.loads(done.stdout)
    return {**result["untraced"], "peak": result["traced"]["peak"]}


def _amplified(folder: Path, names: int) -> Path:
    (folder / "stacks").mkdir(parents=True, exist_ok=True)
    (folder / "stacks" / "rank-0.txt").write_text(py_spy_dump(4 * 1024 * 1024), "utf-8")
    write_index(folder, dict.fromkeys(range(names), "rank-0.txt"))
    return folder


def _budget(folder: Path) -> Path:
    (folder / "stacks").mkdir(parents=True, exist_ok=True)
    for rank in range(16):
        (folder / "stacks" / f"rank-{rank}.txt").write_text(py_spy_dump(4 * 1024 * 1024 - 1), "utf-8")
    write_index(folder, {rank: f"rank-{rank}.txt" for rank in range(16)})
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", action="store_true")
    parser.add_argument("--before-names", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"amplified index (4,096 names, one 4 MiB file)": ("amplified", _amplified(Path(tmp) / "a", 4096)),
                 "budget (16 files of 4 MiB)": ("budget", _budget(Path(tmp) / "b")),
                 "deep error file (100,000 deep)": ("deep", Path(tmp)),
                 "4096-rank table": ("table", Path(tmp))}
        if args.before:
            cases[f"before: amplified index, {args.before_names} names"] = (
                "before", _amplified(Path(tmp) / "c", args.before_names))
        for name, (case, folder) in cases.items():
            runs = [_run(case, folder) for _ in range(args.runs)]
            seconds = statistics.median(float(r["seconds"]) for r in runs)  # type: ignore[arg-type]
            peak = statistics.median(int(r["peak"]) for r in runs)  # type: ignore[call-overload]
            rss = statistics.median(int(r["rss"]) for r in runs)  # type: ignore[call-overload]
            print(f"{name}: {seconds:.3f} s, peak {peak / 2**20:.1f} MiB traced, max RSS {rss / 2**20:.0f} MiB"
                  f" ({runs[0]['extra']})")


if __name__ == "__main__":
    main()
