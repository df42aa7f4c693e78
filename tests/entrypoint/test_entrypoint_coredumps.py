"""Where the kernel writes a core, read from core_pattern, and why a core is sometimes not kept."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from trainguard_entrypoint.coredumps import (CorePolicy, CoreProcess, collect_child_cores, collect_core_files, core_glob,
                                             core_process)


def _policy(pattern: str | None, *, uses_pid: bool = False, reason: str | None = None) -> CorePolicy:
    return CorePolicy(pattern=pattern, uses_pid=uses_pid, soft_limit=-1, hard_limit=-1, disabled_reason=reason)


@pytest.mark.parametrize(
    ("pattern", "uses_pid", "expected"),
    [
        ("core", False, "/srv/job/core"),
        ("core", True, "/srv/job/core.4242"),
        ("core.%p", True, "/srv/job/core.4242"),
        ("cores/core.%e.%p.%t", False, "/srv/job/cores/core.*.4242.*"),
        ("/var/crash/core.%e.%p", False, "/var/crash/core.*.4242"),
        ("/var/crash/core-%s-%%", False, "/var/crash/core-11-%"),
        ("core[1]", False, "/srv/job/core[[]1]"),
    ],
)
def test_the_core_glob_follows_core_pattern(pattern: str, uses_pid: bool, expected: str) -> None:
    got = core_glob(_policy(pattern, uses_pid=uses_pid), pid=4242, cwd=Path("/srv/job"), signal_number=11)

    assert got == expected


def test_a_core_written_by_the_pattern_is_moved_into_coredumps(tmp_path: Path) -> None:
    cwd, dest = tmp_path / "cwd", tmp_path / "coredumps"
    cwd.mkdir()
    (cwd / "core.77").write_bytes(b"ELF core")
    (cwd / "core.78").write_bytes(b"another process's core")

    names, reason = collect_core_files(_policy("core.%p"), pid=77, cwd=cwd, signal_number=11, exit_code=139,
                                       core_dumped=True, dest=dest, not_before=0.0)

    assert (names, reason) == (["core.77"], None)
    assert (dest / "core.77").read_bytes() == b"ELF core"
    assert (cwd / "core.78").exists()


def test_a_core_older_than_the_attempt_is_not_taken_for_this_crash(tmp_path: Path) -> None:
    (tmp_path / "core").write_bytes(b"from last week")
    os.utime(tmp_path / "core", (1_000_000, 1_000_000))

    names, reason = collect_core_files(_policy("core"), pid=5, cwd=tmp_path, signal_number=6, exit_code=134,
                                       core_dumped=False, dest=tmp_path / "dumps", not_before=2_000_000.0)

    assert names == []
    assert reason is not None and "the kernel dumped no core for SIGABRT" in reason


def test_a_piped_core_pattern_explains_where_the_core_went(tmp_path: Path) -> None:
    reason = "core_pattern pipes cores to a handler outside this container (|/usr/lib/systemd/systemd-coredump %P); look for the core there"
    names, got = collect_core_files(_policy("|/usr/lib/systemd/systemd-coredump %P", reason=reason), pid=5,
                                    cwd=tmp_path, signal_number=11, exit_code=139, core_dumped=True,
                                    dest=tmp_path / "dumps", not_before=0.0)

    assert (names, got) == ([], reason)


def test_a_second_core_with_the_same_name_does_not_overwrite_the_first(tmp_path: Path) -> None:
    cwd, dest = tmp_path / "cwd", tmp_path / "coredumps"
    cwd.mkdir()
    dest.mkdir()
    (dest / "core").write_bytes(b"first")
    (cwd / "core").write_bytes(b"second")

    names, _ = collect_core_files(_policy("core"), pid=9, cwd=cwd, signal_number=11, exit_code=139,
                                  core_dumped=True, dest=dest, not_before=0.0)

    assert names == ["core.1"]
    assert (dest / "core").read_bytes() == b"first"



def test_a_link_or_a_fifo_the_command_planted_where_its_core_goes_is_not_taken_for_a_core(tmp_path: Path) -> None:
    cwd, host = tmp_path / "cwd", tmp_path / "host-secret"
    cwd.mkdir()
    host.write_bytes(b"host bytes")
    (cwd / "core.77").symlink_to(host)
    os.mkfifo(cwd / "core")

    for pattern, planted in (("core.%p", "core.77"), ("core", "core")):
        names, reason = collect_core_files(_policy(pattern), pid=77, cwd=cwd, signal_number=11, exit_code=139,
                                           core_dumped=True, dest=tmp_path / "coredumps", not_before=0.0)

        assert names == [] and not (tmp_path / "coredumps" / planted).exists()
        assert reason is not None and f"{planted} is not a regular file of its own" in reason


def _elf_core(pid: int, ppid: int, name: bytes, *, headers_before_note: int = 0) -> bytes:
    """A minimal 64-bit ELF core: program headers (loads, then the note segment) and its notes,
    a thread's NT_PRSTATUS first and the NT_PRPSINFO naming the process second, as Linux writes them."""
    def note(kind: int, owner: bytes, desc: bytes) -> bytes:
        padded = owner + b"\0" * (-len(owner) % 4)
        return struct.pack("<III", len(owner), len(desc), kind) + padded + desc + b"\0" * (-len(desc) % 4)

    info = bytearray(136)
    struct.pack_into("<ii", info, 24, pid, ppid)
    info[40:40 + len(name)] = name
    notes = note(1, b"CORE\0", bytes(336)) + note(3, b"CORE\0", bytes(info))
    count = headers_before_note + 1
    offset = 64 + 56 * count
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 4, 62, 1, 0, 64, 0, 0, 64, 56,
                                                                     count, 0, 0, 0)
    loads = b"".join(struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, 0, 0, 1) for _ in range(headers_before_note))
    return header + loads + struct.pack("<IIQQQQQQ", 4, 0, offset, 0, 0, len(notes), 0, 1) + notes


def test_a_core_names_its_process_and_its_parent(tmp_path: Path) -> None:
    (tmp_path / "core").write_bytes(_elf_core(4242, 17, b"python3", headers_before_note=3))

    assert core_process(tmp_path / "core") == CoreProcess(4242, 17, "python3")
    for junk in (b"", b"ELF core", b"\x7fELF" + bytes(60), _elf_core(1, 2, b"x")[:200]):
        (tmp_path / "junk").write_bytes(junk)
        assert core_process(tmp_path / "junk") is None


def test_the_cores_of_the_commands_children_are_kept_and_no_one_elses(tmp_path: Path) -> None:
    """A launcher's rank aborts with a core while the launcher exits 1: the rank's core is the evidence."""
    cwd, dest = tmp_path / "cwd", tmp_path / "coredumps"
    cwd.mkdir()
    (cwd / "core.901").write_bytes(_elf_core(901, 900, b"pt_main_thread"))  # a rank of the command (pid 900)
    (cwd / "core.950").write_bytes(_elf_core(950, 33, b"python"))  # an orphan the entrypoint (pid 33) reaped
    (cwd / "core.777").write_bytes(_elf_core(777, 1, b"python"))  # another job's, in the same folder
    (cwd / "core.900").write_bytes(_elf_core(900, 33, b"torchrun"))  # the command's own: collect_core_files's

    names, problems = collect_child_cores(_policy("core.%p"), parents=frozenset({900, 33}), command_pid=900,
                                          cwd=cwd, dest=dest, not_before=0.0)

    assert (names, problems) == (["core.901.pt_main_thread.901", "core.950.python.950"], [])
    assert sorted(p.name for p in cwd.iterdir()) == ["core.777", "core.900"]
    assert core_process(dest / names[0]) == CoreProcess(901, 900, "pt_main_thread")
