"""A local attempt whose job floods its folders: thousands of cores, logs over their budget, sparse cores.

The job runs for real under the local backend's entrypoint; the collector freezes its folder into
an evidence folder. A folder of more entries than a listing takes costs a listing of that many and
says how many it left out; each log the job writes (the console log, a torchrun rank's log) is
stored masked up to the log budget and said to be cut; a sparse core within the core budget is
kept whole by apparent size with its holes kept, and a 10 TB one costs neither disk nor time.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from hostile import SECRET, within

from trainguard.core.backends.base import Launch
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.stores.folder import LocalEvidenceStore

LOG_BUDGET = 256 * 1024
CORE = 1024 ** 3  # the sparse core's apparent size: 1 GiB holding 8 bytes

FLOODING_TRAINER = r"""
import os, sys
ws, ck = os.environ["TRAINGUARD_WORKSPACE"], os.environ["TRAINGUARD_CHECKPOINT_DIR"]
cores, ranks = os.path.join(ws, "coredumps"), os.path.join(ws, "ranks", "run", "attempt_0", "0")
for folder in (cores, ranks, os.path.join(ck, "step-000002")):
    os.makedirs(folder, exist_ok=True)
for i in range(5300):
    os.close(os.open(os.path.join(cores, "core.%06d" % i), os.O_CREAT | os.O_WRONLY, 0o600))
    with open(os.path.join(ck, "step-000002", "shard-%06d" % i), "wb") as f:
        f.write(b"w")
with open(os.path.join(cores, "core.0-sparse"), "wb") as f:
    f.write(b"ELF!")
    f.seek(700 * 1024 ** 2)
    f.write(b"END!")
    f.truncate(1024 ** 3)
with open(os.path.join(cores, "core.+10T"), "wb") as f:
    f.truncate(10 * 1024 ** 4)
line = "step 1 HF_TOKEN=" + os.environ["HF_TOKEN"] + " " + "x" * 1000 + "\n"
with open(os.path.join(ranks, "stdout.log"), "w") as f:
    f.write(line * 600)
sys.stdout.write(line * 600)
print("TypeError: unsupported operand type(s) for +: 'int' and 'str'", flush=True)
sys.exit(1)
"""


def test_a_flooding_job_is_collected_within_its_entry_limit_log_budget_and_core_budget(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work", grace_seconds=2.0, budget=Budget(log_bytes=LOG_BUDGET))
    ref = backend.provision("flood-1", 1)
    launch = Launch("flood-1", 1, (sys.executable, "-c", FLOODING_TRAINER), env={"HF_TOKEN": SECRET},
                    deadline_seconds=120)
    outcome = within(150, lambda: backend.run(ref, launch, on_line=lambda line: None), "the attempt to end")
    assert (outcome.reason, outcome.exit_code) == ("Error", 1), outcome.message
    store = LocalEvidenceStore(tmp_path / "evidence")
    started = time.monotonic()

    manifest = within(240, lambda: backend.collect_evidence(ref, store, outcome), "the evidence").manifest

    items = {item.name: item for item in manifest.items}
    why = {miss.name: miss.reason for miss in manifest.missing}
    cores = [name for name in items if name.startswith("coredumps/")]
    assert len(cores) == 1 + 4998, len(cores)  # the 10 TB core is listed but not copied; then the first 4,998
    assert "302 entries from core.004998 on not listed: the listing stops at 5000 entries" in why[
        "coredumps/core.004998"], why
    assert "10995116277760 bytes (apparent size), over the core dump budget" in why["coredumps/core.+10T"]
    core = items["coredumps/core.0-sparse"]
    kept = store.root / core.key
    assert core.size_bytes == kept.stat().st_size == CORE and kept.stat().st_blocks * 512 < 1024 * 1024
    with kept.open("rb") as handle:
        assert handle.read(4) == b"ELF!" and (handle.seek(700 * 1024 ** 2), handle.read(4))[1] == b"END!"
    assert core.sha256 == _sha256_of_sparse_core()
    for log in ("logs/train-flood-1-attempt-1.log", "ranks/run/attempt_0/0/stdout.log"):
        data = store.get_bytes(items[log].key)
        assert len(data) < LOG_BUDGET + 4096 and data.startswith(b"step 1 HF_TOKEN=***"), (log, len(data))
        assert SECRET.encode() not in data and "log budget of 262144 bytes a file" in why[f"{log} (cut)"]
    assert "300 entries from shard-005000 on" in why["checkpoint/step-000002/shard-005000"]  # copied up to the limit
    assert store.get_bytes(items["checkpoints.json"].key).count(b'"left_out": 301') == 1
    assert time.monotonic() - started < 200


def _sha256_of_sparse_core() -> str:
    digest = hashlib.sha256(b"ELF!")
    zeros = bytes(1024 * 1024)
    left = 700 * 1024 ** 2 - 4
    while left:
        digest.update(zeros[: min(left, len(zeros))])
        left -= min(left, len(zeros))
    digest.update(b"END!")
    left = CORE - 700 * 1024 ** 2 - 4
    while left:
        digest.update(zeros[: min(left, len(zeros))])
        left -= min(left, len(zeros))
    return digest.hexdigest()
