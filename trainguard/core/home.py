"""trainguard's data root: where local runs keep their work folders, evidence and spool.

``TRAINGUARD_HOME`` names it; without it, it is ``trainguard-data`` in the working directory
(``./dev`` sets it to the checkout's ``trainguard-data``, so runs started there land in one place
whatever folder a command runs from). The default folders of the local backend, the evidence folder
and the S3 spool are spelt ``trainguard-data/...``: those, and only those, resolve under the data
root; any other relative path is taken from the working directory, as given.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_NAME = "trainguard-data"
VARIABLE = "TRAINGUARD_HOME"


def data_root() -> Path:
    """The data root: ``$TRAINGUARD_HOME``, else ``./trainguard-data``, as an absolute path."""
    configured = os.environ.get(VARIABLE, "").strip()
    return (Path(configured).expanduser() if configured else Path(DEFAULT_NAME)).resolve()


def data_path(path: str | Path) -> Path:
    """``path`` as an absolute path: ``trainguard-data/x`` is ``x`` under the data root."""
    path = Path(path).expanduser()
    if not path.is_absolute() and path.parts[:1] == (DEFAULT_NAME,):
        return data_root().joinpath(*path.parts[1:])
    return path.resolve()
