"""What torchrun leaves in an attempt's folder, as triage reads it: the agent's root-cause error
file and each rank's own, under the places `workspace.torchrun_env` points torchrun at.

The files are the job's: each is read only if it is a regular file linked once, reached through no
link (no linked folder on the way either), and at most `MAX_ERROR_FILE_BYTES` of it; what cannot be read is left out, since the log says the same in
more words. A local rank becomes a global one with the node's rank and processes per node.
"""

from __future__ import annotations

from pathlib import Path

from trainguard_entrypoint.files import read_json_object

from trainguard.core.backends import jobfiles, workspace
from trainguard.core.triage.errorfile import ErrorFile, local_rank_of, parse_error_file

MAX_ERROR_FILE_BYTES = 1024 * 1024  # a traceback; anything larger is not one
MAX_RANK_FILES = 4096  # ranks' folders read at the most on one node


def error_files(folder: Path, *, node_rank: int = 0, processes_per_node: int = 1) -> tuple[ErrorFile, ...]:
    """The error files torchrun wrote in one node's attempt folder: the agent's copy first, then each rank's.

    Args:
        folder: The node's attempt folder (the container's `TRAINGUARD_WORKSPACE`, as seen here).
        node_rank: The node's rank, to turn a local rank into a global one.
        processes_per_node: Ranks per node, likewise.
    """
    found: list[ErrorFile] = []
    agent = _parsed(folder, f"{workspace.TORCHELASTIC}/{workspace.TORCHELASTIC_ERROR}", None)
    if agent is not None:
        found.append(agent)
    for relative in _rank_error_files(folder)[:MAX_RANK_FILES]:
        local = local_rank_of(relative)
        rank = None if local is None else node_rank * processes_per_node + local
        if (parsed := _parsed(folder, relative, rank)) is not None:
            found.append(parsed)
    return tuple(found)


def _rank_error_files(folder: Path) -> list[str]:
    """``ranks/<run>/attempt_<n>/<local rank>/error.json`` under the node's folder, through no linked folder,
    each level listed within `MAX_RANK_FILES` entries."""
    ranks = folder / workspace.RANKS
    found = []
    for run in jobfiles.folders(ranks, MAX_RANK_FILES):
        attempts = [a for a in jobfiles.folders(ranks / run, MAX_RANK_FILES) if a.startswith("attempt_")]
        for attempt in attempts:
            for local in jobfiles.folders(ranks / run / attempt, MAX_RANK_FILES):
                found.append(f"{workspace.RANKS}/{run}/{attempt}/{local}/{workspace.TORCHELASTIC_ERROR}")
                if len(found) >= MAX_RANK_FILES:
                    return found
    return found


def nodes_error_files(folders: list[tuple[int, Path]]) -> tuple[ErrorFile, ...]:
    """The error files of several nodes' folders, each node's ranks made global with its own
    processes per node (`PET_NPROC_PER_NODE` as its environment snapshot recorded it)."""
    found: list[ErrorFile] = []
    for node_rank, folder in folders:
        found.extend(error_files(folder, node_rank=node_rank, processes_per_node=_nprocs(folder)))
    return tuple(found)


def _nprocs(folder: Path) -> int:
    env = read_json_object(folder / workspace.SNAPSHOT / workspace.ENV_SNAPSHOT) or {}
    variables = env.get("variables") if isinstance(env.get("variables"), dict) else env
    value = variables.get("PET_NPROC_PER_NODE") if isinstance(variables, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else 1


def _parsed(folder: Path, relative: str, rank: int | None) -> ErrorFile | None:
    data = jobfiles.read_small(folder, relative, MAX_ERROR_FILE_BYTES)  # None: absent, a link, a FIFO, ...
    if data is None or len(data) > MAX_ERROR_FILE_BYTES:
        return None
    return parse_error_file(data, rank=rank, source=str(folder / relative))
