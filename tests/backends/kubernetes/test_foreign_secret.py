"""An attempt's Secret that someone else made first is never taken as the attempt's own, against kubesim.

Whoever may create Secrets in the namespace can make `tg-<run>-a<n>-env` before the attempt does,
with values of their choosing; the flow's account may create Secrets but not read them, so it
cannot check whose it is. A Job just created whose Secret is already there is not started.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

from hostile import within

from trainguard.core.backends.base import START_ERROR, Launch
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings

CODE = "import os\nprint('logging in with', os.environ['DB_PASSWORD'], flush=True)\n"


def test_a_secret_planted_before_the_attempt_stops_it_before_any_pod_reads_it(kube: KubeApi, ns: str,
                                                                             tmp_path: Path) -> None:
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                     local_root=str(tmp_path / "local")))
    ref = b.provision("k-planted", 1)
    name = manifests.secret_name("k-planted", 1)
    kube.create_secret(ns, {"metadata": {"name": name}, "type": "Opaque",
                            "data": {"DB_PASSWORD": base64.b64encode(b"attacker-chosen").decode()}})
    launch = Launch("k-planted", 1, (sys.executable, "-c", CODE),
                    env={"DB_PASSWORD": "the-real-one", "TRAINGUARD_SECRET_NAMES": "DB_PASSWORD"})
    lines: list[str] = []

    outcome = within(120, lambda: b.run(ref, launch, on_line=lines.append), "the attempt")

    assert outcome.reason == START_ERROR and f"the Secret {ns}/{name} was there before" in (outcome.message or "")
    assert kube.list_pods(ns, manifests.selector("k-planted", 1))["items"] == []
    assert not any("attacker-chosen" in line for line in lines)
