"""Fingerprints: the same root cause maps to one value across ranks, steps and attempts."""

from __future__ import annotations

from trainguard.core import triage


def diagnose(log: str) -> triage.Diagnosis:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None
    return diagnosis


def test_two_ooms_at_different_steps_on_different_ranks_share_a_fingerprint() -> None:
    a = diagnose(
        "2025-06-01T10:00:00.1Z stderr F step 120 loss 2.1\n"
        "2025-06-01T10:00:01.2Z stderr F [rank0]: torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 336.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which "
        "141.25 MiB is free. Process 2109115 has 78.99 GiB memory in use.")
    b = diagnose(
        "step 98812 loss 1.7\n"
        "[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 6 "
        "has a total capacity of 79.15 GiB of which 12.00 MiB is free. Process 77 has 79.1 GiB "
        "memory in use.")
    assert (a.rank, b.rank) == (0, 6)
    assert a.fingerprint == b.fingerprint


def test_an_oom_and_an_nccl_timeout_do_not_share_a_fingerprint() -> None:
    oom = diagnose("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 MiB.")
    nccl = diagnose("[rank1]:[E626 06:24:44.90 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE)")
    assert oom.fingerprint != nccl.fingerprint


def test_different_bugs_of_one_category_have_different_fingerprints() -> None:
    a = diagnose("TypeError: forward() got an unexpected keyword argument 'token_type_ids'")
    b = diagnose("AttributeError: 'DistributedDataParallel' object has no attribute 'model'")
    assert a.category == b.category and a.fingerprint != b.fingerprint


def test_addresses_pids_and_timestamps_do_not_change_a_fingerprint() -> None:
    a = diagnose("*** SIGSEGV (@0x7f3035503980) received by PID 27807 (TID 0x7f2fed38f700)")
    b = diagnose("*** SIGSEGV (@0x55d1c0de) received by PID 4 (TID 0x7fffabcd1234)")
    assert a.fingerprint == b.fingerprint
