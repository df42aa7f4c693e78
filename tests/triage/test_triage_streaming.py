"""Reading logs of any size and encoding: streaming, block boundaries, both engines agree.

Logs are generated on disk in tmp_path; the scan reads them through the same path/stream code
the CLI and the flow use. Hyperscan-specific tests are skipped where it cannot be imported; the
pure-re engine is always exercised.
"""

from __future__ import annotations

import io
import json
import re
import sys
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage import engines, pipeline, scan

DEV = Path(__file__).parent / "corpus" / "dev" / "dev.jsonl"
OOM = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
ENGINES = ["re"] + (["hyperscan"] if triage.hyperscan_available() else [])


def progress(lines: int) -> bytes:
    return b"".join(
        b"[rank%d]: iter %d | lm loss: 1.%04d | grad norm: 0.9 | lr 1.0E-05\n" % (i % 8, i, i % 9999)
        for i in range(lines))


def write_big_log(path: Path, target_bytes: int) -> int:
    """Progress lines up to the size asked for, then the crash; returns the crash's line number."""
    chunk = progress(20000)
    lines = 0
    with path.open("wb") as fh:
        while fh.tell() < target_bytes:
            fh.write(chunk)
            lines += 20000
        fh.write(OOM)
    return lines + 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_large_log_is_scanned_from_disk_with_the_right_line_number(
        tmp_path: Path, engine: str) -> None:
    log = tmp_path / "train.log"
    # Past one read block for Hyperscan; the pure-re engine is slower, so a smaller log.
    crash_line = write_big_log(log, (24 << 20) if engine == "hyperscan" else (3 << 20))
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log), engine=engine)
    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.line_number, diagnosis.rank) == (
        Category.CUDA_OOM, crash_line, 3)


def test_scanning_a_large_log_holds_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    write_big_log(log, 64 << 20)
    tracemalloc.start()
    try:
        diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert diagnosis is not None and diagnosis.category is Category.CUDA_OOM
    # The block being read here, the next one in the engine on the second thread, the one being
    # read from disk, and small change: bounded by the block size, not the log's.
    assert peak < 4 * scan.BLOCK_BYTES, f"peak {peak >> 20} MiB for a 64 MiB log"


@pytest.mark.parametrize("block_bytes", [7, 64, 4096])
def test_lines_split_across_reads_are_still_found(
        monkeypatch: pytest.MonkeyPatch, block_bytes: int) -> None:
    monkeypatch.setattr(scan, "BLOCK_BYTES", block_bytes)
    log = progress(50) + b"partial line without end " * 3 + b"\n" + OOM + b"tail without newline"
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=io.BytesIO(log)))
    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.line_number) == (Category.CUDA_OOM, 52)


def test_a_line_longer_than_any_real_one_is_cut_not_buffered_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "BLOCK_BYTES", 1024)
    log = b"x" * (scan.MAX_LINE_BYTES * 3) + b"\n" + OOM
    blocks = list(scan.blocks(log))
    assert max(stop - start for _, start, stop in blocks) <= scan.MAX_LINE_BYTES + 1024
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None and diagnosis.category is Category.CUDA_OOM


@pytest.mark.parametrize("engine", ENGINES)
def test_bytes_that_are_not_utf8_do_not_hide_the_cause(engine: str) -> None:
    log = (b"\xff\xfe\x00garbage \x80\x81\n"
           b"caf\xe9 latin-1 line\n"
           b"RuntimeError: CUDA error: uncorrectable ECC error encountered \xc3\x28\n")
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log), engine=engine)
    assert diagnosis is not None
    assert diagnosis.category is Category.GPU_FAULT and diagnosis.line_number == 3
    assert "\ufffd" in diagnosis.signature


def test_a_binary_stream_is_read_like_a_file(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(progress(10) + OOM)
    with log.open("rb") as fh:
        from_stream = triage.classify(triage.Signals(exit_code=1, log=fh))
    from_path = triage.classify(triage.Signals(exit_code=1, log=log))
    from_text = triage.classify(triage.Signals(exit_code=1, log=log.read_text()))
    assert from_stream == from_path == from_text


def test_the_fallback_signature_is_the_last_line_of_the_log() -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=3, log=b"starting\nsomething odd happened\n\n"))
    assert diagnosis is not None and diagnosis.category is Category.UNKNOWN
    assert diagnosis.signature == "exit code 3; something odd happened"
    assert diagnosis.line_number == 2


def test_without_hyperscan_the_pure_re_engine_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_hs", None)
    scanner = scan.Scanner(triage.load_rules())
    assert scanner.engine_name == "re"
    assert not engines.hyperscan_available()


@pytest.mark.skipif(not triage.hyperscan_available(), reason="hyperscan cannot be imported here")
def test_both_engines_give_identical_diagnoses_on_the_dev_corpus() -> None:
    for line in DEV.read_text().splitlines():
        row = json.loads(line)
        signals = triage.Signals(exit_code=row["exit_code"], reason=row["reason"],
                                 events=tuple(row["events"]) if isinstance(row["events"], list)
                                 else row["events"] or (), log=row["log"])
        assert triage.classify(signals, engine="re") == triage.classify(
            signals, engine="hyperscan"), row["id"]


@pytest.mark.skipif(not triage.hyperscan_available(), reason="hyperscan cannot be imported here")
def test_the_compiled_database_is_reused_from_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path))
    rules = triage.load_rules()
    first = scan.Scanner(rules, "hyperscan")
    cached = list(tmp_path.glob("hs-*.db"))
    assert len(cached) == 1
    second = scan.Scanner(rules, "hyperscan")
    result = second.scan(OOM)
    assert result.hits and first.scan(OOM).hits == result.hits


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrent_classifications_from_threads_do_not_interfere(engine: str) -> None:
    logs = [progress(2000) + OOM, progress(1500) + b"Segmentation fault (core dumped)\n"] * 4
    expected = [triage.classify(triage.Signals(exit_code=1, log=log), engine=engine)
                for log in logs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda log: triage.classify(
            triage.Signals(exit_code=1, log=log), engine=engine), logs))
    assert got == expected


def test_time_slices_are_short_only_while_an_engine_runs_a_block_ahead() -> None:
    before = sys.getswitchinterval()
    scanner = scan.Scanner(triage.load_rules())
    blocks = [(progress(50), 0, len(progress(50)))] * 3
    during = [sys.getswitchinterval() for _ in pipeline.ahead(scanner.engine, iter(blocks))]
    threaded = isinstance(scanner.engine, engines.HyperscanEngine)
    shortened = min(pipeline.SLICE_SECONDS, before)
    assert during == pytest.approx([shortened if threaded else before] * 3)
    # Two scans at once: the first to end leaves the interval short for the other.
    first = pipeline.ahead(scanner.engine, iter(blocks))
    next(first)
    second = pipeline.ahead(scanner.engine, iter(blocks))
    next(second)
    first.close()
    assert sys.getswitchinterval() == pytest.approx(shortened if threaded else before)
    second.close()
    assert sys.getswitchinterval() == pytest.approx(before)


def test_the_engine_has_the_next_whole_block_in_hand_while_one_is_read() -> None:
    # A file is read as a whole block, then the line that straddled the read, in turn. With
    # only the next block in flight, the engine's pass over a whole block never overlapped the
    # reading of one: the two threads took turns.
    scanner = scan.Scanner(triage.load_rules())
    assert isinstance(scanner.engine, engines.HyperscanEngine)  # the engine that runs ahead
    whole, line = progress(6000), progress(1)
    assert len(whole) >= pipeline.CHUNK_BYTES > len(line)
    blocks = [(whole if i % 2 == 0 else line, 0, len(whole if i % 2 == 0 else line))
              for i in range(7)]
    handed: list[None] = []  # the database to scan with is asked for as each block is handed
    for index, _ in enumerate(pipeline.ahead(scanner.engine, iter(blocks),
                                             lambda: handed.append(None))):
        later_whole = [i for i in range(index + 1, len(blocks)) if i % 2 == 0]
        assert not later_whole or later_whole[0] < len(handed), (index, len(handed))
    assert len(handed) == len(blocks)
    # A source of small blocks only (short reads from a pipe) is not read ahead without bound.
    handed.clear()
    small = [(line, 0, len(line))] * 20
    for index, _ in enumerate(pipeline.ahead(scanner.engine, iter(small),
                                             lambda: handed.append(None))):
        assert len(handed) <= min(index + 1 + pipeline.MAX_AHEAD, len(small))
    assert len(handed) == len(small)


def test_required_literals_cover_every_alternative() -> None:
    assert engines.required_literals("NCCL error") == [b"NCCL error"]
    literals = engines.required_literals("Segmentation fault|SIGSEGV \\(@") or []
    for text in (b"Segmentation fault (core dumped)", b"*** SIGSEGV (@0x0) received"):
        assert any(lit in text for lit in literals), literals
    assert engines.required_literals("a|\\d+") is None
    assert engines.required_literals("(?i)loss\\W{0,3}\\s*(?:nan|inf)\\b") == [b"loss"]


def test_candidate_patterns_leave_out_the_words_every_progress_line_prints() -> None:
    rule = r"(?i)\bnan\b.{0,40}\bloss\b|\bloss\b.{0,40}\b(?:nan|diverged)\b"
    loose = engines.candidate_source(rule)
    assert loose == rb"(?i)\bnan\b|\b(?:nan|diverged)\b"
    healthy = "iter 120 | lm loss: 2.41 | grad norm: 0.93"
    assert not re.search(loose.decode(), healthy)
    for line in ("loss is NaN at step 3", "NaN in the loss", "the loss diverged", healthy):
        assert bool(re.search(loose.decode(), line)) >= bool(re.search(rule, line)), line
    # Nothing rarer to look for instead: the pattern stays as it is.
    assert engines.candidate_source(r"loss.{0,9}\d+") == rb"loss.*\d+"
    assert engines.candidate_source("NCCL error.*rank") == b"NCCL error.*rank"


def test_candidate_patterns_leave_out_the_words_routine_lines_print() -> None:
    # Every checkpoint save prints "checkpoint", every retried request's warning "error": a part
    # naming only such words is left out when a rarer part finds the same lines.
    rule = (r"(?i)\b(?:error|fail(?:ed|ure)?|unable|cannot|can.t)\b.{0,40}"
            r"\b(?:load(?:ing)?|restor(?:e|ing))\b.{0,40}\bcheckpoint")
    loose = engines.candidate_source(rule)
    assert loose == rb"(?i)\b(?:load(?:ing)?|restor(?:e|ing))\b"
    corrupt = r"(?i)checkpoint\S* (?:is )?(?:corrupt|truncated)"
    assert engines.candidate_source(corrupt) == rb"(?i) (?:is )?(?:corrupt|truncated)"
    routine = ["Saving model checkpoint to /out/checkpoint-500",
               "wandb: Network error (ReadTimeout), entering retry loop."]
    for line in routine + ["Error while restoring checkpoint: missing keys",
                           "failed loading checkpoint", "checkpoint-9 is truncated"]:
        for pattern, loosened in ((rule, loose), (corrupt, engines.candidate_source(corrupt))):
            assert bool(re.search(loosened.decode(), line)) >= bool(re.search(pattern, line))
    assert not any(re.search(loose.decode(), line) for line in routine)
    # A part naming a rarer word besides is kept: "NCCL WARN" alone is not looked for.
    kept = "NCCL WARN .*(?:failed|closed by remote)"
    assert engines.candidate_source(kept) == kept.encode()
