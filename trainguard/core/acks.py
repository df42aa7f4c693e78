"""Acknowledgements of checkpoints the training-side helper saved, as the core reads them.

The format and its hostile-input-proof reader live with the entrypoint (stdlib-only, shared with the
helper that writes them); this is the core's name for them.
"""

from __future__ import annotations

from trainguard_entrypoint.acks import Ack, AckFile, Progress, read_ack, read_acks, read_progress, verify

__all__ = ["Ack", "AckFile", "Progress", "read_ack", "read_acks", "read_progress", "verify"]
