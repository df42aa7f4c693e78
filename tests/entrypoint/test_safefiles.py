"""Reading what a training job left, on real files: links, FIFOs, devices, sockets, sparse files, odd names."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import tracemalloc
from pathlib import Path

import pytest

from trainguard_entrypoint import safefiles
from trainguard_entrypoint.safefiles import Refused


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "attempt"
    folder.mkdir()
    return folder


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    secret = tmp_path / "host-secret.txt"
    secret.write_bytes(b"HOST-ONLY-BYTES")
    return secret


def _refusal(path: Path, root: Path | None = None, **options: bool) -> Refused:
    with pytest.raises(Refused) as caught:
        safefiles.open_regular(path, root, **options)
    return caught.value


def test_a_regular_file_inside_the_root_is_opened_blocking(root: Path) -> None:
    (root / "log.txt").write_bytes(b"step 1\n")
    with safefiles.open_regular(root / "log.txt", root) as handle:
        assert handle.read() == b"step 1\n"
        assert os.get_blocking(handle.fileno())


def test_a_symbolic_link_to_a_host_file_is_refused_not_followed(root: Path, host_file: Path) -> None:
    (root / "core").symlink_to(host_file)
    refused = _refusal(root / "core", root)
    assert refused.kind == "symlink" and "not followed" in refused.reason and isinstance(refused, OSError)


def test_a_file_reached_through_a_linked_folder_is_outside_the_root(root: Path, host_file: Path) -> None:
    (root / "snapshot").symlink_to(host_file.parent)
    refused = _refusal(root / "snapshot" / host_file.name, root)
    assert refused.kind == "outside"


def test_a_fifo_is_refused_at_once_without_blocking(root: Path) -> None:
    os.mkfifo(root / "step-9.pt")  # nobody ever writes it: an open for reading would wait forever
    assert _refusal(root / "step-9.pt", root).kind == "fifo"


def test_a_character_device_is_refused(root: Path) -> None:
    if os.geteuid() == 0:
        os.mknod(root / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
        assert _refusal(root / "zero", root).kind == "device"
    assert _refusal(Path("/dev/zero")).kind == "device"


def test_a_socket_and_a_directory_are_refused(root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
        assert _refusal(root / "sock", root).kind == "socket"
    (root / "dir").mkdir()
    assert _refusal(root / "dir", root).kind == "directory"


def test_a_hard_link_is_refused_unless_allowed(root: Path, host_file: Path) -> None:
    os.link(host_file, root / "copy")
    assert _refusal(root / "copy", root).kind == "hardlink"
    with safefiles.open_regular(root / "copy", root, allow_hardlinks=True) as handle:
        assert handle.read() == b"HOST-ONLY-BYTES"


def test_a_missing_file_is_refused_as_missing(root: Path) -> None:
    assert _refusal(root / "nothing", root).kind == "missing"


def test_read_bytes_refuses_what_is_over_its_limit(root: Path) -> None:
    (root / "report.json").write_bytes(b"x" * 11)
    assert safefiles.read_bytes(root / "report.json", root, limit_bytes=11) == b"x" * 11
    with pytest.raises(Refused) as caught:
        safefiles.read_bytes(root / "report.json", root, limit_bytes=10)
    assert caught.value.kind == "budget"


def test_walk_yields_regular_files_and_says_why_it_skipped_the_rest(root: Path, host_file: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "core.1").write_bytes(b"core")
    (root / "a" / "z.txt").write_bytes(b"z")
    (root / "etc").symlink_to(host_file.parent)  # a linked folder: never walked into
    (root / "leak").symlink_to(host_file)
    os.mkfifo(root / "pipe")
    (root / ".partial").write_bytes(b"in flight")

    entries = {entry.name: entry for entry in safefiles.walk(root, root)}

    assert {n for n, e in entries.items() if e.kind == "file"} == {"a/b/core.1", "a/z.txt"}
    assert entries["a/b/core.1"].size_bytes == 4
    assert (entries["etc"].kind, entries["leak"].kind, entries["pipe"].kind) == ("symlink", "symlink", "fifo")
    assert all(e.reason for e in entries.values() if e.kind != "file")
    assert ".partial" not in entries and host_file.name not in " ".join(entries)


def test_walk_of_a_linked_folder_or_a_missing_one_says_so_and_reads_nothing(root: Path, host_file: Path) -> None:
    (root / "coredumps").symlink_to(host_file.parent)
    assert [(e.kind, e.name) for e in safefiles.walk(root / "coredumps", root)] == [("symlink", "")]
    assert [e.kind for e in safefiles.walk(root / "none", root)] == ["missing"]


def test_walk_stops_at_its_limits(root: Path) -> None:
    for index in range(5):
        (root / "many" / f"f{index}").parent.mkdir(exist_ok=True)
        (root / "many" / f"f{index}").write_bytes(b"")
    (root / "d1" / "d2").mkdir(parents=True)
    (root / "d1" / "d2" / "deep").write_bytes(b"")
    kinds = [e.kind for e in safefiles.walk(root / "many", root, max_entries=3)]
    assert kinds == ["file", "file", "file", "limit"]
    deep = {e.name: e.kind for e in safefiles.walk(root / "d1", root, max_depth=0)}
    assert deep == {"d2": "limit"}


def test_past_its_limit_walk_counts_what_each_open_folder_left_out(root: Path) -> None:
    for folder, count in (("a", 3), ("b/inner", 4), ("c", 2)):
        (root / folder).mkdir(parents=True)
        for index in range(count):
            (root / folder / f"f{index}").write_bytes(b"")

    entries = list(safefiles.walk(root, root, max_entries=6))

    files = [e.name for e in entries if e.kind == "file"]
    assert files == ["a/f0", "a/f1", "a/f2"]  # a, its three files, b and b/inner take the 6 places
    limits = [(e.name, e.left_out) for e in entries if e.kind == "limit"]
    assert limits == [("b/inner/f0", 4), ("c", 1)]  # c is counted once, not opened
    assert all("the listing stops at 6 entries" in e.reason for e in entries if e.kind == "limit")
    assert safefiles.MAX_ENTRIES == 5_000
    assert [e.kind for e in safefiles.walk(root, root)] == ["file"] * 9  # all of it, within the default


def test_a_folder_of_tens_of_thousands_of_files_is_walked_in_memory_for_the_limit_only(root: Path) -> None:
    many = root / "coredumps"
    many.mkdir()
    for index in range(40_000):
        os.close(os.open(many / f"core.{index:08d}-{'x' * 60}", os.O_CREAT | os.O_WRONLY, 0o600))

    tracemalloc.start()
    try:
        entries = list(safefiles.walk(many, root, max_entries=100))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert [e.kind for e in entries] == ["file"] * 100 + ["limit"]
    assert entries[0].name == f"core.{0:08d}-{'x' * 60}" and entries[-1].left_out == 40_000 - 100
    assert peak < 1024 * 1024, f"{peak} bytes held to list 100 of 40,000 names"  # all the names: ~5 MB


def test_copy_keeps_the_holes_of_a_sparse_file_and_its_digest_is_the_whole_content(root: Path, tmp_path: Path) -> None:
    sparse = root / "core.7"
    with sparse.open("wb") as out:
        out.seek(64 * 1024 * 1024)
        out.write(b"DATA")
        out.truncate(128 * 1024 * 1024)
    digest = hashlib.sha256()
    with safefiles.open_regular(sparse, root) as source, (tmp_path / "copy").open("wb") as dest:
        copied = safefiles.copy(source, dest, keep_holes=True, digest=digest)

    assert copied == safefiles.Copied(128 * 1024 * 1024, 128 * 1024 * 1024, True)
    result = tmp_path / "copy"
    assert result.stat().st_size == 128 * 1024 * 1024 and result.stat().st_blocks * 512 < 1024 * 1024
    assert digest.hexdigest() == hashlib.sha256(sparse.read_bytes()).hexdigest()
    with result.open("rb") as handle:
        handle.seek(64 * 1024 * 1024)
        assert handle.read(4) == b"DATA"


def test_copy_counts_the_budget_by_apparent_size_and_refuses_or_cuts(root: Path) -> None:
    huge = root / "core.8"
    with huge.open("wb") as out:
        out.truncate(10 * 1024 ** 4)  # 10 TB that cost nothing on disk
    with safefiles.open_regular(huge, root) as source:
        refused = safefiles.copy(source, io.BytesIO(), budget_bytes=1024)
        cut_into = io.BytesIO()
        cut = safefiles.copy(source, cut_into, budget_bytes=1024, truncate=True)
    assert (refused.copied_bytes, refused.complete) == (0, False) and "apparent size" in refused.reason
    assert (cut.copied_bytes, cut.complete, cut_into.getvalue()) == (1024, False, bytes(1024))


def test_copy_stops_at_its_time_bound(root: Path) -> None:
    (root / "log").write_bytes(b"x" * (3 * safefiles.CHUNK_BYTES))
    ticks = iter(range(100))
    with safefiles.open_regular(root / "log", root) as source:
        copied = safefiles.copy(source, io.BytesIO(), timeout_seconds=1.5, clock=lambda: float(next(ticks)))
    assert not copied.complete and "time bound" in copied.reason
    assert copied.copied_bytes == safefiles.CHUNK_BYTES  # one chunk at t=1, then t=2 is past the bound


@pytest.mark.parametrize("name", [
    "\x1b[31mred", "abc\u202etxt.exe", "100%", "back\\slash", "tab\there", os.fsdecode(b"bad-\xff\xfe-utf8"),
    "zero\u200bwidth", "line\u2028sep", "nul?\x7f",
])
def test_a_safe_name_is_printable_and_gives_the_original_back(name: str) -> None:
    spelled = safefiles.safe_name(name)
    assert spelled.isprintable() and "\x1b" not in spelled and "\u202e" not in spelled
    assert safefiles.original_name(spelled) == name


@pytest.mark.parametrize("name", ["step-000120.pt", "épreuve 1.log", "core.1234", "模型.bin"])
def test_an_ordinary_name_is_left_as_it_is(name: str) -> None:
    assert safefiles.safe_name(name) == name
