"""Noisy logs: many lines match a pattern, few are failures; the answer must not change.

The scan remembers rejected lines by their digit-masked shape, stops looking at a rule once it
has enough lines, and checks context patterns only around a candidate line. Each shortcut is
checked here against the case it could get wrong.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage import noisy as noisy_module
from trainguard.core.triage import scan, shapes

ENGINES = ["re"] + (["hyperscan"] if triage.hyperscan_available() else [])
RETRY_NOISE = (b"[rank%d]: WARNING:urllib3.connectionpool:Retrying (Retry(total=4)) after connection"
               b" broken by 'ReadTimeoutError(\"HTTPSConnectionPool(host='s3.amazonaws.com', "
               b"port=443): Read timed out.\")': /bucket/shard-%d.tar\n")
NCCL_NOISE = b"h-%d:1234:5678 [%d] NCCL INFO Call to connect returned Connection refused, retrying\n"
SAVE = b"[rank0]: checkpoint saved to /ckpt/run-7/step_%d.pt\n"


def noisy(lines: int) -> bytes:
    out = []
    for i in range(lines):
        out.append(b"[rank%d]: iter %d | lm loss: 1.%04d\n" % (i % 8, i, i % 9999))
        if i % 3 == 0:
            out.append(RETRY_NOISE % (i % 8, i))
        if i % 5 == 0:
            out.append(NCCL_NOISE % (i % 8, i % 8))
        if i % 7 == 0:
            out.append(SAVE % i)
    return b"".join(out)


def classify(log: bytes, engine: str, **signals: object) -> triage.Diagnosis:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log, **signals),  # type: ignore[arg-type]
                                engine=engine)
    assert diagnosis is not None
    return diagnosis


@pytest.mark.parametrize("engine", ENGINES)
def test_a_real_error_after_thousands_of_retry_warnings_of_the_same_kind_is_found(engine: str) -> None:
    log = noisy(8000) + b"requests.exceptions.ConnectionError: HTTPSConnectionPool(host='s3.amazonaws.com', port=443): Read timed out.\n"
    diagnosis = classify(log, engine)
    assert diagnosis.category is Category.TRANSIENT_IO
    assert diagnosis.line_number == log.count(b"\n")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_line_of_a_remembered_shape_with_other_digits_is_judged_on_its_own(engine: str) -> None:
    # Both read "HTTP Error 000 ..." once masked; only the 503 is a server error.
    log = b"".join(b"[rank0]: HTTP Error 404 for url https://hub/x/%d\n" % i for i in range(2000))
    log += b"[rank0]: HTTP Error 503 for url https://hub/x/1\n"
    diagnosis = classify(log, engine)
    assert diagnosis.category is Category.TRANSIENT_IO
    assert diagnosis.line_number == 2001


@pytest.mark.parametrize("engine", ENGINES)
def test_noise_does_not_change_the_diagnosis(engine: str) -> None:
    crash = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    quiet = classify(b"[rank0]: iter 1 | lm loss: 1.0\n" + crash, engine)
    loud = classify(noisy(5000) + crash + noisy(100), engine)
    assert (loud.category, loud.rule_id, loud.rank, loud.signature) == (
        quiet.category, quiet.rule_id, quiet.rank, quiet.signature)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_saturated_rule_keeps_its_earliest_line_on_each_rank(engine: str) -> None:
    warning = (b"[rank%d]:[W socket.cpp:663] [c10d] The client socket has failed to connect to "
               b"[localhost]:29500 (errno: 97 - Address family not supported by protocol).\n")
    log = b"".join(warning % (i % 4) for i in range(5000))
    result = scan.Scanner(triage.load_rules(), engine).scan(log)
    rule = next(i for i, r in enumerate(triage.load_rules().rules) if r.id == "nccl.error")
    firsts = {h.line.rank: h.line_number for h in result.hits if h.rule == rule}
    assert firsts == {0: 1, 1: 2, 2: 3, 3: 4}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("block_bytes", [256, 4096, 1 << 20])
def test_context_is_found_before_and_after_the_line_across_blocks(
        monkeypatch: pytest.MonkeyPatch, engine: str, block_bytes: int) -> None:
    monkeypatch.setattr(scan, "BLOCK_BYTES", block_bytes)
    filler = b"".join(b"[rank0]: iter %d | lm loss: 1.0\n" % i for i in range(200))
    eof = b"EOFError: Ran out of input\n"
    before = filler + b'  File "/opt/torch/serialization.py", line 1025, in load\n' + filler[:300] + eof
    after = filler + eof + b"while calling torch.load on /ckpt/last.pt\n" + filler
    neither = filler + eof + filler
    assert classify(before, engine).category is Category.CHECKPOINT_CORRUPTED
    assert classify(after, engine).category is Category.CHECKPOINT_CORRUPTED
    assert classify(neither, engine).category is not Category.CHECKPOINT_CORRUPTED


def test_context_further_away_than_the_window_does_not_count() -> None:
    far = (b'  File "/opt/torch/serialization.py", line 1025, in load\n'
           + b"".join(b"[rank0]: iter %d\n" % i for i in range(60)) + b"EOFError: Ran out of input\n")
    assert classify(far, "re").category is not Category.CHECKPOINT_CORRUPTED


@pytest.mark.parametrize("pattern, blind", [
    (r"Connection refused|NCCL", True),
    (r"\bretry \d+\b", True),
    (r"c10d|NCCL", False),
    (r"HTTP Error (?:429|503)", False),
    (r"[0-9]+ items", True),
    (r"[1-9] items", False),
])
def test_digit_blindness_is_read_from_the_regex(pattern: str, blind: bool) -> None:
    assert shapes.digit_blind(pattern) is blind


def test_a_veto_by_a_mixed_regex_is_remembered_only_through_its_digit_blind_part() -> None:
    import re
    parts = shapes.blind_parts(re.compile(r"c10d|ProcessGroup|\[retry \d|NCCL"))
    assert [p.pattern for p in parts] == ["ProcessGroup", r"\[retry \d", "NCCL"]


@pytest.mark.parametrize("pattern, text, widened", [
    (r"\b(?:s3|gcs)\b.{0,120}\berror\b", "s3 read error", r"\b(?:s[0-9]|gcs)\b.{0,120}\berror\b"),
    (r"Errno 28", "Errno 28", "Errno [0-9][0-9]"),
    (r"x{2}3", "xx3", "x{2}[0-9]"),
    (r"[^0-9a]x", "bx", None),  # widening what a negated class refuses would narrow it
    (r"(\d)\1", "11", None),  # a back-reference: not read
])
def test_a_regex_widened_to_any_digit_matches_whatever_the_regex_matches(
        pattern: str, text: str, widened: str | None) -> None:
    import re
    wide = shapes.widened(pattern)
    assert (wide.pattern if wide else None) == widened
    if wide is not None:
        assert re.search(pattern, text) and shapes.digit_blind(wide.pattern)
        assert wide.search(text.translate(str.maketrans("123456789", "000000000")))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_shape_rejected_by_a_regex_with_digits_still_lets_its_digit_variant_through(
        engine: str) -> None:
    # "s4 ..." is rejected by the storage hint's "s3"; masked, both lines read "s0 ...".
    log = b"".join(b"[rank0]: s4 read error on shard %d\n" % i for i in range(3000))
    log += b"[rank0]: s3 read error on shard 1\n"
    diagnosis = classify(log, engine)
    assert diagnosis.category is Category.TRANSIENT_IO
    assert diagnosis.line_number == 3001


@pytest.mark.parametrize("engine", ENGINES)
def test_a_real_error_among_sparse_noise_of_its_own_kind_is_found_far_into_the_log(
        engine: str) -> None:
    # A few retry warnings in every chunk: past the first chunks, only the lines holding the
    # noisy patterns' literals are looked at, and the real error is one of them.
    lines = []
    for i in range(24000):  # about four chunks
        lines.append(b"[rank%d]: iter %d | lm loss: 1.%04d\n" % (i % 8, i, i % 9999))
        if i % 120 == 0:
            lines.append(RETRY_NOISE % (i % 8, i))
        if i % 150 == 0:
            lines.append(NCCL_NOISE % (i % 8, i % 8))
    real = (b"[rank2]: requests.exceptions.ConnectionError: HTTPSConnectionPool(host='s3.amazonaws"
            b".com', port=443): Read timed out.\n")
    log = b"".join(lines[:-90]) + real + b"".join(lines[-90:])
    diagnosis = classify(log, engine)
    assert diagnosis.category is Category.TRANSIENT_IO
    assert (diagnosis.line_number, diagnosis.rank) == (len(lines) - 90 + 1, 2)


def test_the_lines_holding_a_noisy_patterns_literal_are_found_by_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scanner = scan.Scanner(triage.load_rules())
    pid = next(i for i, p in enumerate(scanner.patterns) if b"Connection refused" in p.prefilter)
    chunk = b"".join(b"[rank0]: iter %d\n" % i + NCCL_NOISE % (i, i) for i in range(3))
    lines = noisy_module.LiteralLines(scanner.finders)
    assert lines.shapes(chunk, 0, len(chunk), [pid]) is None  # not yet seen in two chunks
    found = lines.shapes(chunk, 0, len(chunk), [pid])
    if not triage.hyperscan_available():
        assert found is None  # every chunk is masked whole
        return
    shape = b"h-0:0000:0000 [0] NCCL INFO Call to connect returned Connection refused, retrying"
    starts = [i for i in range(len(chunk)) if chunk.startswith(b"h-", i)]
    assert found is not None
    assert {s: found[s] for s in found.keys()} == {shape: starts}
    # More such lines than that costs in callbacks: this chunk and the next are masked whole.
    monkeypatch.setattr(noisy_module, "MAX_LINES", 2)
    assert lines.shapes(chunk, 0, len(chunk), [pid]) is None
    assert lines.shapes(chunk, 0, len(chunk), [pid]) is None


def test_once_a_noisy_log_is_long_the_engine_scans_without_its_noisy_patterns(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The engine's database without the noisy patterns (their lines are found by the scan's own
    # pass) is compiled after NARROW_AFTER chunks; every hit stays the one found without it.
    monkeypatch.setattr(noisy_module, "NARROW_AFTER", 2)
    monkeypatch.setattr(scan, "BLOCK_BYTES", 256 << 10)  # blocks handed to it after that
    real = (b"[rank2]: requests.exceptions.ConnectionError: HTTPSConnectionPool(host='s3.amazonaws"
            b".com', port=443): Read timed out.\n")
    lines = []
    for i in range(30000):  # ~60 noisy lines in each chunk of 256 KiB: few enough to be found
        lines.append(b"[rank%d]: iter %d | lm loss: 1.%04d\n" % (i % 8, i, i % 9999))
        if i % 40 == 0:
            lines.append(RETRY_NOISE % (i % 8, i))
        if i % 50 == 0:
            lines.append(NCCL_NOISE % (i % 8, i % 8))
    log = b"".join(lines[:-300]) + real + b"".join(lines[-300:])
    used: list[bool] = []
    database = noisy_module.LiteralLines.database

    def spied(self: noisy_module.LiteralLines) -> object:
        used.append(database(self) is not None)
        return database(self)

    monkeypatch.setattr(noisy_module.LiteralLines, "database", spied)
    # Only the rules these lines can concern: their databases compile in milliseconds.
    every = triage.load_rules()
    sample = [(RETRY_NOISE % (0, 1)).decode(), (NCCL_NOISE % (0, 0)).decode(), real.decode()]
    rules = dataclasses.replace(every, rules=tuple(
        r for r in every.rules if any(x.search(line) for x in r.log_res for line in sample)))
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "narrowed"))
    scanner = scan.Scanner(rules)
    found = scanner.scan(log)
    assert any(used) is triage.hyperscan_available()
    monkeypatch.setenv("TRAINGUARD_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(noisy_module, "NARROW_AFTER", 10**9)
    used.clear()
    assert repr(found) == repr(scanner.scan(log)) and not any(used)
    assert any(hit.line.text.endswith("Read timed out.") and hit.line.rank == 2
               for hit in found.hits)
