"""The code that runs inside a training container, around the training command.

``python -m trainguard_entrypoint --workspace DIR --run-id R --attempt N -- COMMAND ...`` snapshots
the environment (secrets redacted), host and GPU state, tees the command's output to the console
and a log file, forwards termination signals, keeps core dumps and writes a crash report. It is
stdlib-only and imports nothing else of trainguard, so a training image needs neither Prefect nor
the Kubernetes client. Code that talks to Prefect, Kubernetes or an object store does not belong
here.
"""

from __future__ import annotations

REPORT_FORMAT = 1
"""Version of the JSON files this package writes (crash report, snapshot indexes)."""

ORIGINAL_PYTHONPATH = "TRAINGUARD_ORIGINAL_PYTHONPATH"
"""Set by a launcher that put trainguard on PYTHONPATH to start us: the command's own PYTHONPATH
("" when it had none), restored for the command so it never sees trainguard's source tree."""
