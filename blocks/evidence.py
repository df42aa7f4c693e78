"""Evidence store blocks: where the frozen crime scene of every attempt is kept.

`EvidenceFolder` keeps evidence in a local (or mounted) folder. An object-store block joins it behind
the same `store()` factory.
"""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field

from trainguard.core.stores import EvidenceStore, LocalEvidenceStore


class EvidenceFolder(Block):
    """Keeps each attempt's evidence under `runs/{run_id}/attempt-{n}/` in a folder."""

    _block_type_name = "trainguard Evidence Folder"
    _block_type_slug = "trainguard-evidence-folder"
    _description = "Store attempt evidence (logs, snapshots, checkpoints, core dumps, manifest) in a folder."

    root: str = Field(default="trainguard-data/evidence", description="The evidence folder.")

    def store(self) -> EvidenceStore:
        """The store this block describes."""
        return LocalEvidenceStore(Path(self.root).expanduser().resolve())
