"""The training log as the supervisor follows it live: a line that never ends costs linear time and
is shown while it grows, in pieces of at most 64 KiB (as the local runner and the Slurm tail cut
theirs), each shown as its first 8,192 characters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import podstate, supervise
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from waiting import wait_for

PROGRESS = ("import sys, time\n"
            "for i in range(20000):\n"
            "    sys.stdout.write('\\rprogress %06d' % i)\n"
            "sys.stdout.flush()\n"
            "time.sleep(120)\n")


def test_a_progress_bar_without_a_newline_is_shown_while_it_grows(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                     local_root=str(tmp_path)))
    ref = b.provision("r-bar", 1)
    shown: list[str] = []
    box: list[Any] = []
    launch = Launch(run_id="r-bar", attempt=1, command=("python", "-c", PROGRESS))
    thread = threading.Thread(target=lambda: box.append(b.run(ref, launch, on_line=shown.append)), daemon=True)
    thread.start()
    wait_for(lambda: any("progress 00" in line for line in shown), timeout=60,
             what="a piece of the unfinished progress line shown")
    kube.delete_job(ns, ref.name)  # the line never ends: stop the attempt from outside
    thread.join(60)
    assert box and box[0].reason == "JobDeleted"
    pieces = [line for line in shown if "progress" in line]
    assert pieces and all(len(line) <= podstate.LINE_LIMIT_CHARS for line in pieces)


class _Stream:
    """The part of KubeApi the log follower uses, streaming one line that never ends."""

    def __init__(self, total_bytes: int, chunk_bytes: int = 64 * 1024) -> None:
        self.total_bytes, self.chunk_bytes = total_bytes, chunk_bytes

    def stream_pod_log(self, namespace: str, name: str, container: str | None = None,
                       **_: Any) -> Iterator[bytes]:
        chunk = (b"\rprogress 123456" * (self.chunk_bytes // 16 + 1))[: self.chunk_bytes]
        for _ in range(self.total_bytes // self.chunk_bytes):
            yield chunk


def test_a_128_mb_line_without_a_newline_costs_linear_time_and_is_cut_into_64_kib_pieces() -> None:
    shown: list[str] = []
    supervisor = supervise.Supervisor(_Stream(128 << 20), "ns", "r", 1, supervise.Limits(), on_line=shown.append)
    started = time.process_time()
    supervisor._follow_log("pod")
    spent = time.process_time() - started
    assert len(shown) == (128 << 20) // supervise.LINE_PIECE_BYTES  # every piece handed out, none held back
    assert all("progress 123456" in line for line in shown)
    assert spent < 20, f"{spent:.1f}s of CPU for one 128 MB line"
    assert len(supervisor.ending.log_tail) == supervise.LOG_TAIL_LINES


def test_a_stream_is_cut_the_same_way_whatever_its_chunks_so_a_resumed_follow_skips_exactly_what_it_showed() -> None:
    stream = b"short\n" + b"x" * 10 + b"\n" + b"y" * 8 + b"\n" + b"z" * 9
    cuts = []
    for chunk_bytes in (1, 3, 4, 7, len(stream)):
        cutter = supervise.LineCutter(piece_bytes=4)
        found = [p for i in range(0, len(stream), chunk_bytes) for p in cutter.feed(stream[i:i + chunk_bytes])]
        cuts.append((found, cutter.pending))
    assert all(cut == cuts[0] for cut in cuts)
    assert cuts[0] == ([b"shor", b"t", b"xxxx", b"xxxx", b"xx", b"yyyy", b"yyyy", b"zzzz", b"zzzz"], b"z")
