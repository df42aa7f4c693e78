"""Evidence uploads that go on after an attempt's verdict, so its classification and retry never wait on S3.

An attempt holds its store's uploads while it collects (`hold`): every write goes to the local
spool, a frozen copy of what the platform is about to delete. The attempt judges itself and keeps
its verdict from that copy, and only then `start`s the upload of its run's spooled writes, in a
thread of its own. Whoever comes next (the hook that schedules the next attempt, the training-run
flow's next attempt) does not wait for it; the process waits for it before it ends (`finish`),
each upload bounded by its store's upload budget. What S3 did not take by then stays spooled for
the run's next write or `trainguard evidence flush`, as any spooled write does.

A store that writes locally (the evidence folder) has nothing to hold: `hold` says so and `start`
starts nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.core import ids
from trainguard.core.stores.base import EvidenceStore, HoldingStore

# How long an attempt's upload waits for an earlier attempt's upload of the same spool, at most
# (its store's own budget applies too): one after another, not given up at once.
WAIT_FOR_EARLIER_SECONDS = 3600.0


@dataclass
class Upload:
    """One attempt's evidence going up in the background."""

    run_id: str
    attempt: int
    store: EvidenceStore
    manifest_json: str | None  # the bundle's manifest as the verdict left it, to report on without S3
    also: tuple[str, ...] = ()  # keys outside the run's prefix that go up with it (its verdict index record)
    error: str = ""  # set when the upload itself broke (S3's own refusals are the store's `last_error`)

    def run(self) -> None:
        try:
            assert isinstance(self.store, HoldingStore)
            self.store.upload_held(ids.run_path(self.run_id) + "/", WAIT_FOR_EARLIER_SECONDS)
            for key in self.also:
                self.store.upload_held(key, WAIT_FOR_EARLIER_SECONDS)
        except Exception as exc:  # a thread's exception would only reach stderr: keep it for the report
            self.error = f"{type(exc).__name__}: {exc}"


_LOCK = threading.Lock()
_UPLOADS: dict[tuple[str, int], tuple[Upload, threading.Thread]] = {}


def hold(store: EvidenceStore) -> bool:
    """Make ``store`` spool its writes until `start`; whether it can (a folder store writes at once)."""
    if not isinstance(store, HoldingStore):
        return False
    store.hold()
    return True


def start(store: EvidenceStore, run_id: str, attempt: int, manifest_json: str | None,
          also: tuple[str, ...] = ()) -> Upload | None:
    """Send the run's spooled writes up in a thread of its own; None when ``store`` holds nothing back.

    The thread is not a daemon: the interpreter waits for it before it exits, so a process that
    forgets to `finish` still leaves its evidence in S3, or spooled when S3 would not take it.
    """
    if not isinstance(store, HoldingStore):
        return None
    upload = Upload(run_id, attempt, store, manifest_json, also)
    thread = threading.Thread(target=upload.run, name=f"trainguard-upload-{run_id}-{attempt}", daemon=False)
    with _LOCK:
        _UPLOADS[(run_id, attempt)] = (upload, thread)
    thread.start()
    return upload


def finish(run_id: str, attempts: Sequence[int] | None = None) -> list[Upload]:
    """Wait for the run's uploads (of ``attempts``, or all) to end, and forget them; oldest first.

    Each ends by itself within its store's upload budget; an unlimited store's upload ends when
    S3 has everything.
    """
    with _LOCK:
        keys = sorted(key for key in _UPLOADS if key[0] == run_id and (attempts is None or key[1] in attempts))
        chosen = [_UPLOADS.pop(key) for key in keys]
    for _, thread in chosen:
        thread.join()
    return [upload for upload, _ in chosen]
