"""What value-based secret masking costs per MB, on ordinary log lines and on 1 MB single lines.

trainguard masks every line it shows live, every tail, and the copy of the log kept as evidence,
with `Masker` (20 secret values, as a run with a few `secret_env` entries and secret-looking
variables has, plus the token shapes and ``NAME=value`` assignments). Baseline in the same run:
the simplest value masking there is, a ``str.replace`` loop over the same 20 values on the same
text at the same granularity (line by line, or the whole block), which finds no token shapes and
no assignments. Also shown: a plain copy of the bytes (decode and encode), the floor of any pass.

Each figure is the CPU time (process_time) of the best of ``--repeat`` runs, so other work on a
shared machine inflates it less than wall time would; the ratio against the
baseline measured in the same run is what counts). Linearity: a 4 MB single line must cost about
four times a 1 MB one.

Then the evidence copy of a log that is one 1 GB line (``--copy-gb``; a progress bar with a secret
every 4 MiB): `jobfiles.masked_copy`, which masks in bounded overlapping windows, vs a plain copy of
the same file (`safefiles.copy`) as the baseline, each in a child process of its own whose peak RSS
(VmHWM) is read as the copy ends, with their wall and CPU time; the masked copy is then checked to
hold no secret. Usage: .venv/bin/python benchmarks/masking.py [--repeat 5] [--mb 4] [--copy-gb 1]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainguard_entrypoint.redact import Masker  # noqa: E402

MB = 1024 * 1024
SECRETS = [f"v{i:02d}-{random.Random(i).getrandbits(64):016x}" for i in range(20)]
LINE_SHAPES = (
    "step {n} | loss {loss:.4f} | lr 3.0e-04 | grad_norm 1.02 | tokens/s 41235 | mem 38.1GiB",
    "[rank{r}]:[W1201 10:{n:02d}:07.0 ProcessGroupNCCL.cpp:1168] Warning: TORCH_NCCL_ASYNC_ERROR_HANDLING is deprecated",
    "2026-12-01 10:00:{s:02d} INFO trainer.py:412 saved checkpoint to /ckpt/run-7/step-{n:06d}.pt in 2.31s",
    "wandb: syncing run to https://wandb.ai/acme/sweeps/runs/{n:08x}",
    "Epoch {r}:  {p:3d}%|██████▌    | {n}/5000 [01:12<00:41, 42.01it/s, loss={loss:.3f}]",
)
SECRET_LINES = (  # about one line in a hundred carries something to mask
    "export AWS_SECRET_ACCESS_KEY={secret}",
    "pulling model with token hf_{token}",
    "db url postgres://trainer:{secret}@db.internal:5432/metrics",
)


def ordinary_lines(total_bytes: int) -> list[str]:
    rng = random.Random(7)
    lines: list[str] = []
    size = 0
    while size < total_bytes:
        if rng.random() < 0.01:
            line = rng.choice(SECRET_LINES).format(secret=rng.choice(SECRETS), token="a" * 34)
        else:
            n = rng.randrange(100000)
            line = rng.choice(LINE_SHAPES).format(n=n, loss=rng.random(), r=rng.randrange(8), s=n % 60, p=n % 100)
        lines.append(line + "\n")
        size += len(line) + 1
    return lines


def single_lines(total_bytes: int) -> dict[str, str]:
    metrics = '{"step": 1200, "loss": 0.2531, "url": "https://example.com/a/b", "note": "task-17 on disk-3"}, '
    secrets = " ".join(f"AWS_SECRET_ACCESS_KEY={s} hf_{'b' * 30}" for s in SECRETS[:3]) + " "
    return {
        "progress bar (\\r, no \\n)": ("\r 42%|████▏     | 2100/5000 [00:51<01:10, 41.2it/s]" * total_bytes)[:total_bytes],
        "JSON metrics dump": (metrics * (total_bytes // len(metrics) + 1))[:total_bytes],
        "secrets every 200 bytes": (secrets * (total_bytes // len(secrets) + 1))[:total_bytes],
        "upper-case words with KEY": ("MONKEY_KEY_TOKEN_" * (total_bytes // 17 + 1))[:total_bytes],
    }


def best(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return min(times)


def replace_loop(text: str) -> str:
    for value in SECRETS:
        text = text.replace(value, "***")
    return text


def copy(text: str) -> str:
    return text.encode("utf-8").decode("utf-8")


def report(name: str, mb: float, masked: float, baseline: float, floor: float) -> None:
    print(f"{name:34s} {masked / mb:7.3f} s/MB  str.replace loop {baseline / mb:7.3f} s/MB  "
          f"copy {floor / mb:6.3f} s/MB  ratio {masked / baseline:5.1f}x")


COPY_CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[4])
from trainguard.core.backends import jobfiles
from trainguard_entrypoint import safefiles
from trainguard_entrypoint.redact import Masker
mode, source, secrets = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
vmhwm = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
wall, cpu, leaked = time.monotonic(), time.process_time(), None
with safefiles.open_regular(source) as handle:
    size = os.fstat(handle.fileno()).st_size
    if mode == "masked":
        with jobfiles.masked_copy(handle, size, Masker(secrets), wall + 3600) as (path, copied):
            wall, cpu, peak = time.monotonic() - wall, time.process_time() - cpu, vmhwm()
            with open(path, "rb") as out:  # in pieces that overlap by more than a secret
                tail, leaked = b"", False
                while piece := out.read(1024 * 1024):
                    leaked = leaked or any(s.encode() in tail + piece for s in secrets)
                    tail = piece[-64:]
    else:
        with tempfile.NamedTemporaryFile() as out:
            copied = safefiles.copy(handle, out).copied_bytes
            wall, cpu, peak = time.monotonic() - wall, time.process_time() - cpu, vmhwm()
print(json.dumps({"wall": wall, "cpu": cpu, "peak_mib": peak, "copied": copied, "leaked": leaked}))
"""


def one_line_log(folder: Path, gigabytes: float) -> Path:
    """A log that is one line of ``gigabytes`` GB: a progress bar (``\\r``, no ``\\n``), a secret every 4 MiB."""
    path = folder / "one-line.log"
    bar = ("\r 42%|████▏     | 2100/5000 [00:51<01:10, 41.2it/s]" * (4 * MB // 60)).encode()[: 4 * MB - 64]
    with path.open("wb") as out:
        for index in range(int(gigabytes * 1024 / 4)):
            out.write(bar + f" HF_TOKEN={SECRETS[index % len(SECRETS)]} ".encode().ljust(64, b"="))
    return path


def masked_copy_figures(gigabytes: float) -> None:
    with tempfile.TemporaryDirectory(prefix="trainguard-bench-") as folder:
        source = one_line_log(Path(folder), gigabytes)
        runs = {}
        for mode in ("plain", "masked"):
            argv = [sys.executable, "-c", COPY_CHILD, mode, str(source), ",".join(SECRETS),
                    str(Path(__file__).resolve().parents[1])]
            runs[mode] = json.loads(subprocess.run(argv, capture_output=True, check=True, text=True).stdout)
        plain, masked = runs["plain"], runs["masked"]
        assert masked["leaked"] is False and masked["copied"] == plain["copied"] == source.stat().st_size
        print(f"evidence copy of a {source.stat().st_size / MB:,.0f} MiB single line: masked {masked['wall']:.1f} s "
              f"(CPU {masked['cpu']:.1f} s), peak RSS {masked['peak_mib']:.1f} MiB; plain copy {plain['wall']:.1f} s "
              f"(CPU {plain['cpu']:.1f} s), peak RSS {plain['peak_mib']:.1f} MiB; peak RSS ratio "
              f"{masked['peak_mib'] / plain['peak_mib']:.2f}x, time ratio {masked['wall'] / plain['wall']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mb", type=int, default=4, help="size of the ordinary log and of the long single line")
    parser.add_argument("--copy-gb", type=float, default=1.0, help="size of the one-line log copied (0: skip)")
    args = parser.parse_args()
    if args.copy_gb:
        masked_copy_figures(args.copy_gb)
    masker = Masker(SECRETS)
    lines = ordinary_lines(args.mb * MB)
    block = "".join(lines)
    mb = len(block.encode()) / MB
    assert SECRETS[0] not in "".join(masker.mask(line) for line in lines if SECRETS[0] in line)
    print(f"{len(SECRETS)} secret values; ordinary log: {len(lines)} lines, {mb:.1f} MB")
    report("ordinary lines, one by one", mb, best(lambda: [masker.mask(x) for x in lines], args.repeat),
           best(lambda: [replace_loop(x) for x in lines], args.repeat), best(lambda: [copy(x) for x in lines], args.repeat))
    report("ordinary lines, 1 MB blocks", mb, best(lambda: masker.mask(block), args.repeat),
           best(lambda: replace_loop(block), args.repeat), best(lambda: copy(block), args.repeat))
    print(f"single lines (1 MB, then {args.mb} MB for linearity):")
    small, large = single_lines(MB), single_lines(args.mb * MB)
    for name, line in small.items():
        one = best(lambda: masker.mask(line), args.repeat)
        report(f"  {name}", 1.0, one, best(lambda: replace_loop(line), args.repeat), best(lambda: copy(line), args.repeat))
        many = best(lambda: masker.mask(large[name]), max(1, args.repeat // 2))
        print(f"  {'':32s} {args.mb} MB line: {many:.3f} s = {many / one:.1f}x the 1 MB line (linear: {args.mb}x)")


if __name__ == "__main__":
    main()
