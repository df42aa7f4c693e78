"""The collector pod's program: a stdlib-only Python that prints the attempt folder as a base64 tar.

It runs inside the user's training image (trainguard asks only for a Python 3 there), so it may
use nothing but the standard library and `trainguard_entrypoint.safefiles`, which it carries as a
module of its own. The folder is the training job's, so it is read only through `safefiles`: the
attempt folder (and the checkpoint folder) must be reached from its volume's mount point without
any symbolic link, each file is a regular file of its own opened with ``O_NOFOLLOW`` whose real
path lies in that folder, no FIFO, device or socket is read, the budget counts apparent sizes (a
10 TB sparse file costs 10 TB), and the whole copy has a time bound.

Its output is lines on stdout, none longer than `MAX_RECORD_BYTES`, however many files there are:
a META record (where it looked, and why a folder could not be read), one record per file sent,
per file left out and per checkpoint listed, the gzipped tar in base64 lines (member names spelled
with `safefiles.safe_name`), a PROBLEM record per file that went wrong while it was sent, and an
END record with the tar's length and SHA-256, which the reader in ``collector`` checks. Deciding
what to mount and reading the output back belong to ``collector``.
"""

from __future__ import annotations

import inspect

from trainguard_entrypoint import checkpoints as _checkpoints
from trainguard_entrypoint import safefiles as _safefiles

from trainguard.core.backends import workspace

MAGIC = "TRAINGUARD-EVIDENCE/2"
MAX_RECORD_BYTES = 16 * 1024  # well under the 64 KiB a line may have before the reader drops it
# Record kinds: META (once, first), FILE, SKIPPED, CHECKPOINTS (the listing's header), CHECKPOINT,
# CHECKPOINT-SKIPPED, PROBLEM (while the tar is sent) and END (last).
RECORD_KINDS = ("META", "FILE", "SKIPPED", "CHECKPOINTS", "CHECKPOINT", "CHECKPOINT-SKIPPED", "PROBLEM", "END")

# Runs inside the collector pod with the image's own Python 3 (stdlib only). The checkpoint
# listing is the entrypoint's own function, prepended as source, so both sides list alike.
_SCRIPT = r'''
import base64, dataclasses, errno, gzip, hashlib, json, os, stat, sys, tarfile, time
MAGIC = "TRAINGUARD-EVIDENCE/2"
MAX_RECORD_BYTES = 16 * 1024
_ORDER = @ORDER@
_LOGS, _RANKS = @LOGS@, @RANKS@
LOG_SHARE = 4  # a log the job writes takes at most this share of the budget, cut there: it starves no other file
_ZEROS = bytes(1024 * 1024)


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

    def flush(self):
        if self.pending:
            self._emit(self.pending)
        self.pending = b""
        sys.stdout.flush()


def record(kind, payload):
    """One record on a line of its own, never longer than MAX_RECORD_BYTES."""
    line = json.dumps(payload, sort_keys=True)
    if len(line) > MAX_RECORD_BYTES:
        short = {"name": str(payload.get("name", ""))[:1024], "truncated": True}
        if "reason" in payload:
            short["reason"] = str(payload["reason"])[:1024]
        line = json.dumps(short, sort_keys=True)
    sys.stdout.write("%s %s %s\n" % (MAGIC, kind, line))


def unlinked(path, root):
    """None if `path` is a folder reached from `root` (a mount point) through real folders only;
    else why not. Each step is opened with O_NOFOLLOW relative to the one before."""
    relative = os.path.relpath(path, root)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
        return "%s is not on the volume mounted at %s" % (safefiles.safe_name(path), safefiles.safe_name(root))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in [] if relative == os.curdir else relative.split(os.sep):
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                return _why_not(fd, part, path, exc)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return None


def _why_not(fd, part, path, exc):
    shown = safefiles.safe_name(path)
    try:
        info = os.stat(part, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return "no such directory on the volume: %s" % shown
    if stat.S_ISLNK(info.st_mode):
        target = safefiles.safe_name(os.readlink(part, dir_fd=fd))
        return "%s: %s is a symbolic link (to %s) on the volume; not followed" % (shown, safefiles.safe_name(part), target)
    if not stat.S_ISDIR(info.st_mode):
        return "%s: %s is not a folder on the volume; not read" % (shown, safefiles.safe_name(part))
    return "%s: cannot open: %s" % (shown, exc.strerror or exc)


def _rank(name):
    for index, prefix in enumerate(_ORDER):
        if name == prefix or name.startswith(prefix):
            return index
    return len(_ORDER)


def _is_log(name):
    return name.startswith(_LOGS) or (name.startswith(_RANKS) and name.endswith(".log"))


def entries(workspace):
    """Every entry of the attempt folder, each of its folders walked with a limit of its own, so a
    million files in one (cores, ranks) leave the crash report, the log and the snapshots listed."""
    for entry in safefiles.walk(workspace, workspace, hidden=True, max_depth=0):
        if entry.kind != "limit" or entry.left_out:
            yield entry
            continue
        for inner in safefiles.walk(entry.path, workspace, hidden=True):
            yield dataclasses.replace(inner, name="/".join(part for part in (entry.name, inner.name) if part))


def choose(workspace, budget):
    """(files to send with how much of each, entries left out) of the attempt folder, by apparent size
    within the budget; a log is cut at its share of the budget, or at what is left, rather than left out."""
    found, left_out = [], []
    for entry in entries(workspace):
        name = safefiles.safe_name(entry.name) or "."  # "": the folder itself could not be read
        if entry.kind == safefiles.FILE:
            found.append((_rank(name), name, entry))
        else:
            left_out.append({"name": name, "size_bytes": entry.size_bytes, "kind": entry.kind,
                             "reason": entry.reason or entry.kind})
    chosen, spent = [], 0
    for _, name, entry in sorted(found, key=lambda item: item[:2]):
        size = min(entry.size_bytes, budget // LOG_SHARE, budget - spent) if _is_log(name) else entry.size_bytes
        if spent + size > budget or (size < entry.size_bytes and size <= 0):
            reason = ("%d bytes (apparent size), over the %d-byte copy budget; it stays on the volume at %s"
                      % (entry.size_bytes, budget, safefiles.safe_name(entry.path)))
            left_out.append({"name": name, "size_bytes": entry.size_bytes, "kind": "budget", "reason": reason})
            continue
        chosen.append((name, entry, size))
        spent += size
    return chosen, left_out


class _Counted:
    """A writer that counts what passes through it."""

    def __init__(self, out):
        self.out, self.count = out, 0

    def write(self, data):
        self.out.write(data)
        self.count += len(data)
        return len(data)


def send(out, name, entry, folder, deadline, limit):
    """One tar member of at most `limit` bytes, copied through safefiles from the file it is now; a note if
    it went wrong or was cut.

    `folder` is the attempt folder's real path as reached without links: the open file must lie in
    it, whatever became of the path since it was checked.
    """
    try:
        handle = safefiles.open_regular(entry.path, folder)
    except OSError as exc:
        return {"name": name, "reason": str(exc), "valid_bytes": 0, "sent": False}
    with handle:
        try:
            real = os.readlink("/proc/self/fd/%d" % handle.fileno())
        except OSError:
            real = None
        if real is not None and not real.startswith(folder.rstrip("/") + "/"):
            return {"name": name, "reason": "%s: lies outside the attempt folder; not read" % name, "valid_bytes": 0,
                    "sent": False}
        info = os.fstat(handle.fileno())
        member = tarfile.TarInfo(name)
        member.size, member.mtime, member.mode = min(info.st_size, limit), int(info.st_mtime), 0o644
        out.write(member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        counted = _Counted(out)
        try:
            copied = safefiles.copy(handle, counted, budget_bytes=member.size, truncate=True,
                                    timeout_seconds=max(0.0, deadline - time.monotonic()))
            why = None if copied.complete else copied.reason
            if why and "over the budget" in why:
                why = ("cut at %d of %d bytes (apparent size): a log takes at most its share of the copy budget; "
                       "the whole log stays on the volume" % (member.size, info.st_size))
        except OSError as exc:
            why = "cannot read: %s" % (exc.strerror or exc)
        rest = member.size - counted.count
        while rest > 0:  # the tar says how long the member is: zeros stand for what was not copied
            out.write(_ZEROS[:min(rest, len(_ZEROS))])
            rest -= min(rest, len(_ZEROS))
        out.write(bytes(-member.size % tarfile.BLOCKSIZE))
        if why:
            return {"name": name, "reason": why, "valid_bytes": counted.count, "sent": True}
    return None


def listing(checkpoint_dir, root):
    if not checkpoint_dir:
        return
    why = unlinked(checkpoint_dir, root)
    found = {"dir": checkpoint_dir, "absent": why, "files": []} if why else list_checkpoints(Path(checkpoint_dir))
    record("CHECKPOINTS", {k: v for k, v in found.items() if k not in ("files", "skipped")})
    for entry in found.get("files") or ():
        record("CHECKPOINT", dict(entry, name=safefiles.safe_name(entry["name"])))
    for entry in found.get("skipped") or ():
        record("CHECKPOINT-SKIPPED", dict(entry, name=safefiles.safe_name(entry["name"])))


def main(workspace, root, checkpoint_dir, checkpoint_root, budget, timeout_seconds):
    deadline = time.monotonic() + timeout_seconds
    absent = unlinked(workspace, root)
    folder = os.path.normpath(os.path.join(os.path.realpath(root), os.path.relpath(workspace, root)))  # ours: a mount point
    record("META", {"workspace": workspace, "checkpoint_dir": checkpoint_dir, "workspace_absent": absent,
                    "budget_bytes": budget})
    try:
        listing(checkpoint_dir, checkpoint_root)
    except Exception as exc:
        record("PROBLEM", {"name": "checkpoints.json", "reason": "%s: %s" % (type(exc).__name__, exc)})
    chosen, left_out = choose(folder, budget) if absent is None else ([], [])
    for entry in left_out:
        record("SKIPPED", entry)
    for name, entry, _ in chosen:
        record("FILE", {"name": name, "size_bytes": entry.size_bytes})
    lines = _Lines()
    with gzip.GzipFile(fileobj=lines, mode="wb", mtime=0) as out:
        for name, entry, limit in chosen:
            if time.monotonic() > deadline:
                note = {"name": name, "reason": "not sent: the collector's %gs time bound passed" % timeout_seconds,
                        "valid_bytes": 0, "sent": False}
            else:
                note = send(out, name, entry, folder, deadline, limit)
            if note:
                out.flush()
                lines.flush()
                record("PROBLEM", note)
        out.write(bytes(2 * tarfile.BLOCKSIZE))  # the end of the archive
    lines.flush()
    record("END", {"size": lines.size, "sha256": lines.digest.hexdigest()})
    sys.stdout.flush()


main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
'''


_SAFEFILES_IMPORT = "from trainguard_entrypoint import safefiles\n"


def script() -> str:
    """The collector's Python program: `safefiles`, the entrypoint's checkpoint listing, the tar writer.

    The pod has no trainguard package to import, so `safefiles` travels as a module of its own (its
    source, run into a fresh module) and the listing as prepended source that uses it.
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
    return listing.replace(_SAFEFILES_IMPORT, module) + _program()


def _program() -> str:
    """The tar writer, with the attempt folder's names as the entrypoint spells them (`workspace`)."""
    order = (workspace.CRASH_REPORT, *(f"{name}/" for name in (workspace.SNAPSHOT, workspace.LOGS,
                                                                 workspace.TORCHELASTIC, workspace.RANKS)))
    names = {"@ORDER@": repr(order), "@LOGS@": repr(f"{workspace.LOGS}/"), "@RANKS@": repr(f"{workspace.RANKS}/")}
    program = _SCRIPT
    for placeholder, value in names.items():
        program = program.replace(placeholder, value)
    return program
