"""Every rank's stack, taken while the ranks are alive, before a hung attempt is ended.

The entrypoint runs next to the processes it supervises (in the pod, on the Slurm node, as the
local child), so it can see them: `ranks` finds the command's processes that carry a torch rank
(`RANK` in their environment; the command itself when none does). `capture` asks `py-spy dump`
for each one's Python stack (and its native frames where ptrace allows it), within one time
budget for the whole sweep; where py-spy is missing or may not attach, it falls back to Python's
`faulthandler`, which `faulthandler_site` installed in every Python process of the command (a
`sitecustomize` that dumps all threads into one file of the attempt's folder on SIGUSR2, chaining to
any handler and `sitecustomize` of the user's; the processes are asked one at a time, so each dump
is known by where it starts in the file). SIGUSR2 ends a process that does not handle it, and
runs the handler of one that has its own (a requeue handler), so only a process that runs the
site's handler is signalled: it left its pid in `stacks/site/pids` and has not set a SIGUSR2 handler
of its own since (the site removes the pid then), and the kernel shows it catches SIGUSR2
(`SigCgt` in `/proc/<pid>/status`). A shell, a `torchrun --no-python` rank, `python -I/-E/-S`
never ran the site: for a rank that is not Python itself its nearest Python descendant that runs
the handler is asked instead. A rank whose stack cannot be had is recorded as absent, with the reason. Everything lands in ``stacks/`` of the attempt's folder: one file per
rank and an ``index.json`` that says what each is. Comparing the stacks is triage's business.

Stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainguard_entrypoint.paths import INDEX, STACKS, STACKS_SITE

DUMP_SIGNAL = signal.SIGUSR2
_SITE = """# Installed by trainguard's entrypoint: dump every thread's stack into the attempt's
# faulthandler file when trainguard asks (SIGUSR2), so a hang can be told apart. Chains to
# the user's own sitecustomize, and to a SIGUSR2 handler the process already had, untouched.
import os as _os, sys as _sys
try:
    import faulthandler as _fh, signal as _sig
    _dir = _os.environ.get("TRAINGUARD_STACKS_DIR")
    if _dir:  # one file for every process, appended to: the entrypoint asks one process at a time
        _file = open(_os.path.join(_dir, "faulthandler.txt"), "a", buffering=1)
        # chain only to a real handler: chaining to the default action would end the process
        _fh.register(_sig.SIGUSR2, file=_file, all_threads=True, chain=callable(_sig.getsignal(_sig.SIGUSR2)))
        # say so (the entrypoint signals only processes that did), and stop saying so if the process
        # sets a SIGUSR2 handler of its own, which replaces this one
        _pids = _os.path.join(_dir, "site", "pids")
        _os.makedirs(_pids, exist_ok=True)
        _mark = _os.path.join(_pids, str(_os.getpid()))
        open(_mark, "w").close()
        _set = _sig.signal

        def _signal(signalnum, handler, _set=_set, _mark=_mark, _os=_os, _sig=_sig):
            if signalnum == _sig.SIGUSR2:
                try:
                    _os.unlink(_mark)
                except OSError:
                    pass
            return _set(signalnum, handler)

        _sig.signal = _signal
except Exception:
    pass
_here = _os.path.dirname(_os.path.abspath(__file__))
if _sys.modules.get("sitecustomize") is not None and _here in _sys.path:
    _index, _me = _sys.path.index(_here), _sys.modules["sitecustomize"]
    del _sys.path[_index]
    del _sys.modules["sitecustomize"]
    try:
        import sitecustomize  # the user's own, if there is one further down the path
    except ImportError:
        pass
    finally:
        _sys.path.insert(_index, _here)
        _sys.modules["sitecustomize"] = _me  # the import that is running this file expects itself back
"""


def faulthandler_site(workspace: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that make every Python process of the command dump its threads on `DUMP_SIGNAL`.

    Writes ``stacks/site/sitecustomize.py`` into the attempt's folder and puts that folder first
    on ``PYTHONPATH`` (the user's ``PYTHONPATH`` and ``sitecustomize`` stay in effect).
    """
    site = workspace / STACKS / STACKS_SITE
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE, encoding="utf-8")
    path = env.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{site}{os.pathsep}{path}" if path else str(site),
            "TRAINGUARD_STACKS_DIR": str(workspace / STACKS)}


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def ranks(root: int, limit: int = 4096) -> dict[int, int]:
    """rank -> pid of the command's processes that carry a torch rank; {0: root} when none does.

    A rank's own children (DataLoader workers) inherit its `RANK`: the one nearest the root wins.
    """
    found: dict[int, int] = {}
    queue, seen = [root], 0
    while queue and seen < limit:
        pid = queue.pop(0)
        seen += 1
        rank = _environ(pid).get("RANK", "")
        if rank.isdigit() and int(rank) not in found:
            found[int(rank)] = pid
        queue += _children(pid)
    return found or {0: root}


def _py_spy(pid: int, native: bool, timeout: float, py_spy: str) -> tuple[str, str]:
    """(dump, "") or ("", why not)."""
    argv = [py_spy, "dump", "--pid", str(pid), *(["--native"] if native else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return "", f"py-spy did not answer within {timeout:.0f}s"
    except OSError as exc:
        return "", f"py-spy could not run: {exc.strerror or exc}"
    if done.returncode == 0 and "Thread " in done.stdout:
        return done.stdout, ""
    why = (done.stderr or done.stdout).strip().splitlines()
    return "", f"py-spy failed: {why[-1] if why else f'exit {done.returncode}'}"


_ONE_AT_A_TIME = threading.Lock()


def _faulthandler(pid: int, folder: Path, timeout: float, clock: Callable[[], float]) -> tuple[str, str]:
    """Ask the process for its stack through the sitecustomize's handler; read what it appended."""
    with _ONE_AT_A_TIME:
        return _ask_faulthandler(pid, folder / "faulthandler.txt", timeout, clock)


def ended(pid: int) -> bool:
    """Whether the process is gone or a zombie (dead, not yet reaped): no stack will come from it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:][:1] in ("Z", "X", "")


def _ask_faulthandler(pid: int, path: Path, timeout: float, clock: Callable[[], float]) -> tuple[str, str]:
    if not path.exists():
        return "", "no faulthandler file: the command's processes do not run Python's faulthandler handler"
    before = path.stat().st_size
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError as exc:
        return "", f"could not signal it: {exc.strerror or exc}"
    deadline, size = clock() + timeout, before
    while clock() < deadline:
        time.sleep(0.05)
        now = path.stat().st_size
        if now == before and ended(pid):  # a stop reached it first: nothing will come
            return "", "it ended before it could dump its stack"
        if now > before and now == size:  # it grew, and stopped growing: the dump is whole
            with path.open("rb") as handle:
                handle.seek(before)
                return handle.read(now - before).decode(errors="replace"), ""
        size = now
    return "", f"faulthandler wrote nothing within {timeout:.0f}s (not a Python process, or it never ran the site)"


def capture(root: int, workspace: Path, *, budget_seconds: float = 30.0, native: bool = True, why: str = "",
            py_spy: str | None = None, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Take every rank's stack into ``stacks/`` of the attempt's folder; return the index written.

    Args:
        root: The command's pid.
        workspace: The attempt's folder.
        budget_seconds: The whole sweep's time bound (ranks are asked in parallel).
        native: Also ask for native frames (needs ptrace; without it the Python stack is kept).
        why: What triggered the capture (stall, deadline, a peer timeout, by hand).
        py_spy: The py-spy binary; found beside this interpreter or on PATH when None.
    """
    folder = workspace / STACKS
    folder.mkdir(parents=True, exist_ok=True)
    started, deadline = time.time(), clock() + budget_seconds
    tool = py_spy or _find_py_spy()
    found = ranks(root)

    def one(item: tuple[int, int]) -> tuple[int, dict[str, Any]]:
        return item[0], _one_rank(item, folder, tool, native, deadline, clock)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(found)))) as pool:
        results = dict(pool.map(one, sorted(found.items())))
    index = {"format": 1, "why": why, "started_at": started, "seconds": round(time.time() - started, 3),
             "ranks": {str(rank): entry for rank, entry in sorted(results.items())}}
    tmp = folder / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=2), encoding="utf-8")
    os.replace(tmp, folder / INDEX)
    return index


def _one_rank(item: tuple[int, int], folder: Path, tool: str | None, native: bool, deadline: float,
              clock: Callable[[], float]) -> dict[str, Any]:
    """One rank's stack into `folder` (py-spy, native frames first where asked, else faulthandler): its index entry."""
    rank, pid = item
    text, reasons, source = "", [], ""
    if tool:
        for attempt_native in ((True, False) if native else (False,)):
            text, reason = _py_spy(pid, attempt_native, max(1.0, deadline - clock()), tool)
            if text:
                source = "py-spy --native" if attempt_native else "py-spy"
                break
            reasons.append(reason)
    else:
        reasons.append("py-spy is not installed beside the entrypoint or on PATH")
    if not text:
        target = dump_target(pid, folder)
        if target is None:
            reasons.append("not signalled: no process of this rank runs trainguard's faulthandler handler (not "
                           "Python, python -I/-E/-S, or a SIGUSR2 handler of its own), and SIGUSR2 would end or "
                           "disturb it")
        else:
            text, reason = _faulthandler(target, folder, max(1.0, deadline - clock()), clock)
            source = "faulthandler" if text else ""
            if reason:
                reasons.append(reason)
    entry: dict[str, Any] = {"pid": pid, "source": source}
    if text:
        entry["file"] = f"rank-{rank}.txt"
        (folder / entry["file"]).write_text(text, encoding="utf-8", errors="replace")
    else:
        entry["absent"] = "; ".join(reasons)
    return entry


def catches(pid: int, signum: int) -> bool:
    """Whether the kernel shows a handler of ``signum`` in the process (`SigCgt` of its status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def runs_site_handler(pid: int, folder: Path) -> bool:
    """Whether the process runs the site's SIGUSR2 handler (see the module docstring)."""
    return (folder / STACKS_SITE / "pids" / str(pid)).is_file() and catches(pid, DUMP_SIGNAL)


def _python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def dump_target(pid: int, folder: Path, limit: int = 256) -> int | None:
    """The process to ask for a rank's stack: the rank itself if it runs the site's handler; for a rank
    that is not Python (a shell, a `--no-python` rank), its nearest Python descendant that does."""
    queue, seen = [pid], 0
    while queue and seen < limit:
        current = queue.pop(0)
        seen += 1
        if runs_site_handler(current, folder):
            return current
        if current == pid and _python(current):
            return None  # a Python rank that does not run it: its workers' stacks are not its own
        queue += _children(current)
    return None


def _find_py_spy() -> str | None:
    """py-spy next to this interpreter (a virtualenv's bin) or on PATH; None when neither has it."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")
