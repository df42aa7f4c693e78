"""A training job that attacks whoever reads what it leaves, and the checks every backend's evidence must pass.

The job (`HOSTILE_TRAINER`, run as a real attempt's command) writes a real checkpoint, then leaves in
its attempt's folder and the run's checkpoint folder: symbolic links to a host file and to the host
file's folder, a hard link to the host file, FIFOs nobody writes, a character device with
/dev/zero's numbers (as root), a 10 TB sparse file, and files named with a terminal escape and a
bidi override. Then it fails with a code error; given a folder as its second argument, each task
first waits there until every task has planted all (a task that fails first would have the others
killed before they plant: srun's --kill-on-bad-exit). Collecting, listing, resuming and triaging that
attempt must end promptly with evidence that holds none of it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from waiting import wait_for

from trainguard.core.evidence.manifest import Manifest
from trainguard.core.stores.base import EvidenceStore

T = TypeVar("T")
ODD_NAME = "\x1b[31mred\u202eexe.core"
HOST_MARKER = b"HOST-ONLY-BYTES-5f1e"
SECRET = "sekr1t-value-9d2c"  # the job's HF_TOKEN, which it prints
SHAPED = "hf_" + "Q" * 34  # a token it prints, masked by its shape

HOSTILE_TRAINER = r"""
import os, stat, sys
host = sys.argv[1]
rank = int(os.environ.get("SLURM_PROCID", "0"))
ws, ck = os.environ["TRAINGUARD_WORKSPACE"], os.environ["TRAINGUARD_CHECKPOINT_DIR"]
cores, snap = os.path.join(ws, "coredumps"), os.path.join(ws, "snapshot")
for folder in (cores, snap, ck):
    os.makedirs(folder, exist_ok=True)
print(f"rank {rank} HF_TOKEN=" + os.environ.get("HF_TOKEN", "") + " token hf_" + "Q" * 34, flush=True)
if rank == 0:
    with open(os.path.join(ck, "step-000001.pt"), "wb") as f:
        f.write(b"weights-1")
    os.symlink(host, os.path.join(ck, "step-000005.pt"))
    os.mkfifo(os.path.join(ck, "step-000009.pt"))
    if os.geteuid() == 0:
        os.mknod(os.path.join(ck, "step-000007.pt"), stat.S_IFCHR | 0o600, os.makedev(1, 5))
os.symlink(host, os.path.join(cores, "core.leak"))
os.symlink(host, os.path.join(snap, "leak.json"))
os.symlink(os.path.dirname(host), os.path.join(snap, "hostdir"))
os.link(host, os.path.join(snap, "hardlink.json"))
os.mkfifo(os.path.join(cores, "core.pipe"))
if os.geteuid() == 0:
    os.mknod(os.path.join(cores, "core.zero"), stat.S_IFCHR | 0o600, os.makedev(1, 5))
with open(os.path.join(cores, "core.sparse"), "wb") as f:
    f.truncate(10 * 1024 ** 4)
with open(os.path.join(cores, "\x1b[31mred\u202eexe.core"), "wb") as f:
    f.write(b"a small core")
with open(os.path.join(snap, "\x1b]0;pwned\x07title.txt"), "wb") as f:
    f.write(b"snapshot note")
if len(sys.argv) > 2:  # a folder where every task says it planted all, and waits for the others to
    import time
    open(os.path.join(sys.argv[2], f"planted-{rank}"), "w").close()
    tasks, waited = int(os.environ.get("SLURM_NTASKS", "1")), time.monotonic()
    while len(os.listdir(sys.argv[2])) < tasks and time.monotonic() - waited < 60:
        time.sleep(0.05)
print("step 1 loss 0.5", flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "train.py", line 3, in <module>', flush=True)
print("TypeError: unsupported operand type(s) for +: 'int' and 'str'", flush=True)
sys.exit(1)
"""


def host_file(folder: Path) -> Path:
    """A host file the job must not get into the evidence."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "credentials"
    path.write_bytes(HOST_MARKER + b"\n" + os.urandom(64).hex().encode())
    return path


def _stored(store: EvidenceStore, evidence_root: Path | None, prefix: str) -> list[tuple[str, bytes]]:
    if evidence_root is None:
        return [(key, store.get_bytes(key)) for key in store.list_keys(prefix + "/")]
    found = []
    for folder, _, files in os.walk(evidence_root):
        for name in files:
            path = Path(folder) / name
            assert stat.S_ISREG(path.lstat().st_mode), f"{path} is not a regular file in the evidence"
            found.append((str(path), path.read_bytes()))
    return found


def within(seconds: float, action: Callable[[], T], what: str) -> T:
    """``action``'s result if it returns within ``seconds``; fails (leaving it blocked in a daemon thread) if not."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = action()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    threading.Thread(target=run, daemon=True).start()
    wait_for(lambda: box, seconds, what)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


def check_evidence(manifest: Manifest, store: EvidenceStore, evidence_root: Path | None, prefix: str) -> None:
    """No host bytes, no secret, no FIFO or device content, within budget, printable keys, each refusal with why.

    ``evidence_root``: the folder store's root, whose files are checked on disk; None for a store
    read through its keys (S3).
    """
    for where, data in _stored(store, evidence_root, prefix):
        assert len(data) < 16 * 1024 * 1024, f"{where} holds {len(data)} bytes"
        assert HOST_MARKER not in data, f"{where} holds the host file's bytes"
        assert SECRET.encode() not in data and SHAPED.encode() not in data, f"{where} holds a secret"
    keys = store.list_keys(prefix + "/")
    assert keys and all(key.isprintable() for key in keys), [k for k in keys if not k.isprintable()]
    assert all(item.name.isprintable() and item.key.isprintable() for item in manifest.items)
    assert all(item.name.isprintable() for item in manifest.missing)
    names = {item.name for item in manifest.items}
    assert "checkpoint/step-000001.pt" in names, names
    assert not {n for n in names if n.startswith("checkpoint/") and n != "checkpoint/step-000001.pt"}, names
    odd = [item for item in manifest.items if item.original_name == f"coredumps/{ODD_NAME}"]
    assert len(odd) == 1 and odd[0].name == "coredumps/%1B[31mred%E2%80%AEexe.core", manifest.items
    reasons = {item.name: item.reason for item in manifest.missing}
    expected = {"coredumps/core.leak": "symbolic link", "coredumps/core.pipe": "FIFO",
                "coredumps/core.sparse": "apparent size", "snapshot/leak.json": "symbolic link",
                "snapshot/hostdir": "symbolic link", "snapshot/hardlink.json": "hard link"}
    if os.geteuid() == 0:
        expected["coredumps/core.zero"] = "device"
    for name, word in expected.items():
        assert word in reasons.get(name, ""), f"{name}: {reasons.get(name)!r}; missing: {reasons}"
    listing = json.loads(store.get_bytes(f"{prefix}/checkpoints.json"))
    listed = {entry["name"]: entry for entry in listing["files"]}
    assert listed["step-000001.pt"]["sha256"] and "step-000009.pt" not in listed
    skipped = {entry["name"]: entry["reason"] for entry in listing.get("skipped", [])}
    assert "FIFO" in skipped["step-000009.pt"] and "symbolic link" in skipped["step-000005.pt"]
