"""The collector pod's program: a stdlib-only Python that prints the attempt folder as a base64 tar.

It runs inside the user's training image (trainguard asks only for a Python 3 there), so it may
use nothing but the standard library. Its output is lines on stdout: one META line (a JSON
listing: files sent, files skipped with why, the checkpoint listing), the gzipped tar in base64
lines, a PROBLEM line per file that could not be read, and an END line with the tar's length and
SHA-256, which the reader in ``collector`` checks. Deciding what to mount and reading the output
back belong to ``collector``.
"""

from __future__ import annotations

import inspect

from trainguard_entrypoint import checkpoints as _checkpoints
from trainguard_entrypoint import safefiles as _safefiles

MAGIC = "TRAINGUARD-EVIDENCE/1"

# Runs inside the collector pod with the image's own Python 3 (stdlib only). The checkpoint
# listing is the entrypoint's own function, prepended as source, so both sides list alike.
_SCRIPT = r'''
import base64, hashlib, os, stat, sys, tarfile
MAGIC = "TRAINGUARD-EVIDENCE/1"
_ORDER = ("crash-report.json", "snapshot/", "logs/")


class _Lines:
    """A write-only file that prints what it is given as base64 lines, counting and hashing it."""

    def __init__(self):
        self.pending, self.size, self.digest = b"", 0, hashlib.sha256()

    def write(self, data):
        data = bytes(data)
        self.size += len(data)
        self.digest.update(data)
        self.pending += data
        while len(self.pending) >= 3072:
            self._emit(self.pending[:3072])
            self.pending = self.pending[3072:]
        return len(data)

    def _emit(self, chunk):
        sys.stdout.write(base64.b64encode(chunk).decode("ascii") + "\n")

    def close(self):
        if self.pending:
            self._emit(self.pending)
        self.pending = b""
        sys.stdout.flush()


def _rank(name):
    for index, prefix in enumerate(_ORDER):
        if name == prefix or name.startswith(prefix):
            return index
    return len(_ORDER)


def _files(root, meta):
    found = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            path = os.path.join(folder, filename)
            name = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                info = os.lstat(path)
            except OSError as exc:
                meta["problems"].append({"name": name, "reason": "cannot stat: %s" % (exc.strerror or exc)})
                continue
            if not stat.S_ISREG(info.st_mode):
                meta["skipped"].append({"name": name, "size_bytes": 0, "reason": "not a regular file"})
                continue
            found.append((_rank(name), name, path, info.st_size))
    return sorted(found)


def main(workspace, checkpoint_dir, budget):
    meta = {"workspace": workspace, "checkpoint_dir": checkpoint_dir, "files": [], "skipped": [],
            "problems": [], "workspace_absent": None, "checkpoints": None}
    if checkpoint_dir:
        try:
            meta["checkpoints"] = list_checkpoints(Path(checkpoint_dir))
        except Exception as exc:
            meta["problems"].append({"name": "checkpoints.json", "reason": "%s: %s" % (type(exc).__name__, exc)})
    chosen, spent = [], 0
    if not os.path.isdir(workspace):
        meta["workspace_absent"] = "no such directory on the volume: %s" % workspace
    else:
        for _, name, path, size in _files(workspace, meta):
            if spent + size > budget:
                reason = "%d bytes, over the %d-byte copy budget; it stays on the volume at %s" % (size, budget, path)
                meta["skipped"].append({"name": name, "size_bytes": size, "reason": reason})
                continue
            chosen.append((name, path))
            spent += size
    meta["files"] = [name for name, _ in chosen]
    sys.stdout.write("%s META %s\n" % (MAGIC, json.dumps(meta)))
    out = _Lines()
    with tarfile.open(fileobj=out, mode="w|gz") as tar:
        for name, path in chosen:
            try:
                with open(path, "rb") as handle:
                    tar.addfile(tar.gettarinfo(arcname=name, fileobj=handle), handle)
            except OSError as exc:
                note = {"name": name, "reason": "cannot read: %s" % (exc.strerror or exc)}
                out.close()
                sys.stdout.write("%s PROBLEM %s\n" % (MAGIC, json.dumps(note)))
    out.close()
    sys.stdout.write("%s END %d %s\n" % (MAGIC, out.size, out.digest.hexdigest()))
    sys.stdout.flush()


main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
'''


_SAFEFILES_IMPORT = "from trainguard_entrypoint import safefiles\n"


def script() -> str:
    """The collector's Python program: the entrypoint's checkpoint listing, then the tar writer.

    The listing reads the folder through `safefiles`, which the program carries as a module of its
    own (its source, run into a fresh module), since the pod has no trainguard package to import.
    """
    listing = inspect.getsource(_checkpoints)
    if _SAFEFILES_IMPORT not in listing:
        raise RuntimeError("trainguard_entrypoint.checkpoints no longer imports safefiles as the collector expects")
    module = (
        "import sys as _sys, types as _types\n"
        "safefiles = _types.ModuleType('trainguard_safefiles')\n"
        "_sys.modules[safefiles.__name__] = safefiles\n"
        f"exec(compile({inspect.getsource(_safefiles)!r}, 'safefiles.py', 'exec'), safefiles.__dict__)\n"
    )
    return listing.replace(_SAFEFILES_IMPORT, module) + "\nimport json\n" + _SCRIPT
