"""Per-test Slurm backend and evidence blocks; the session's Slurm cluster is tests/backends/conftest.py's."""

from __future__ import annotations

from typing import Any

import pytest
from slurm_helpers import save_slurm_blocks


@pytest.fixture
def slurm_blocks(prefect_server, slurm_node_up, tmp_path) -> dict[str, Any]:
    return save_slurm_blocks(slurm_node_up, tmp_path)
