"""`trainguard run --kubeconfig ...`: a Kubernetes Job backend for a quick run, without the UI.

The flow loads backends by block reference, so the options are kept as a block named after their
own digest (`trainguard-kubernetes-job-backend/cli-<digest>`): the same options reuse one block.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainguard.cli.output import fail


def quick_backend(kubeconfig: Path, *, context: str | None, namespace: str | None, image: str | None,
                  master_port: int | None = None) -> str:
    """Save (or reuse) the block these options describe; its reference."""
    if not kubeconfig.is_file():
        fail(f"--kubeconfig: no such file {kubeconfig}; pass the path of a kubeconfig (e.g. ~/.kube/config)")
    if not image:
        fail("--image is required with --kubeconfig: the training image (it needs a Python 3)")
    from blocks.kubernetes import KubernetesJobBackend

    fields: dict[str, object] = {"kubeconfig_path": str(kubeconfig.resolve()), "context": context,
                                 "namespace": namespace or "default", "image": image}
    if master_port is not None:  # else the block's default, and the same block as before for the same options
        fields["master_port"] = master_port
    name = "cli-" + hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    try:
        KubernetesJobBackend(**fields).save(name, overwrite=True)
    except (RuntimeError, OSError, ValueError) as exc:
        fail(f"could not save the backend block ({exc}); check PREFECT_API_URL or `prefect server start`", code=1)
    return f"{KubernetesJobBackend.get_block_type_slug()}/{name}"
