"""Flows load backend and evidence blocks by reference, whatever their type, and refuse the wrong kind."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from flow_helpers import ROOT, subprocess_env

from blocks import BlockReferenceError, EvidenceFolder, LocalProcessBackend, RetryPolicy, load_backend, load_evidence
from trainguard.core.backends.base import Backend
from trainguard.core.backends.local.backend import LocalBackend


def test_a_backend_block_loads_by_slug_and_name_and_builds_its_adapter(prefect_server, tmp_path) -> None:
    name = f"b-{uuid.uuid4().hex[:8]}"
    LocalProcessBackend(work_root=str(tmp_path / "w"), grace_seconds=3).save(name)
    backend = load_backend(f"trainguard-local-process-backend/{name}")
    assert isinstance(backend, Backend) and isinstance(backend, LocalBackend)
    assert backend.work_root == (tmp_path / "w").resolve() and backend.grace_seconds == 3
    assert load_backend(name) == backend  # a bare name still means the local-process backend


def test_a_block_of_another_kind_is_refused_in_one_line(prefect_server) -> None:
    name = f"p-{uuid.uuid4().hex[:8]}"
    RetryPolicy().save(name)
    with pytest.raises(BlockReferenceError) as caught:
        load_backend(f"trainguard-retry-policy/{name}")
    assert "not a trainguard backend" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(BlockReferenceError, match="no such block"):
        load_evidence("trainguard-evidence-folder/never-saved")


def test_an_evidence_block_loads_by_reference(prefect_server, tmp_path) -> None:
    name = f"e-{uuid.uuid4().hex[:8]}"
    EvidenceFolder(root=str(tmp_path / "ev")).save(name)
    store = load_evidence(f"trainguard-evidence-folder/{name}")
    assert str(tmp_path / "ev") in store.describe()


def test_a_flow_process_imports_prefect_kubernetes_only_for_a_kubernetes_block(prefect_server, tmp_path) -> None:
    """Importing prefect-kubernetes costs a flow process ~1.4 CPU s; a local attempt never needs it.

    `Block.load` imports every installed Prefect collection first, so trainguard's own blocks are
    loaded through their own classes, and the Kubernetes and Slurm blocks' modules only on demand.
    """
    from blocks import KubernetesJobBackend
    from blocks.loading import OWN_TYPES
    from deployments.setup import block_classes

    assert {cls.get_block_type_slug(): (cls.__module__, cls.__name__) for cls in block_classes()} == OWN_TYPES
    suffix = uuid.uuid4().hex[:8]
    KubernetesJobBackend(namespace="ns", image="python:3.11", kubeconfig=str(tmp_path / "kubeconfig")).save(f"k-{suffix}")
    LocalProcessBackend(work_root=str(tmp_path / "w")).save(f"l-{suffix}")
    EvidenceFolder(root=str(tmp_path / "e")).save(f"e-{suffix}")
    RetryPolicy().save(f"r-{suffix}")
    code = ("import sys, flows.attempt; from blocks import load_backend, load_evidence, resolve_policy; "
            "from trainguard.core.spec import parse_spec; "
            f"load_backend('trainguard-local-process-backend/l-{suffix}'); load_evidence('e-{suffix}'); "
            f"resolve_policy(parse_spec({{'name': 'x', 'command': ['true']}}), 'r-{suffix}'); "
            "local = 'prefect_kubernetes' in sys.modules; "
            f"backend = load_backend('trainguard-kubernetes-job-backend/k-{suffix}'); "
            "print(local, type(backend).__name__, 'prefect_kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(prefect_server),
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "KubernetesBackend", "True"], out.stderr[-2000:]


def _fields_without_words(schema: dict, where: str) -> list[str]:
    bare = [f"{where}.{name}" for name, prop in schema.get("properties", {}).items()
            if not prop.get("title") or not prop.get("description")]
    for name, definition in schema.get("definitions", {}).items():
        if str(definition.get("block_type_slug", "trainguard-")).startswith("trainguard-"):  # not another library's
            bare += _fields_without_words(definition, f"{where}#{name}")
    return bare


def test_every_field_of_every_block_form_has_a_title_and_a_description() -> None:
    """The Prefect UI builds block forms from these schemas: a bare field name explains nothing."""
    import importlib

    from blocks.loading import OWN_TYPES

    bare = []
    for slug, (module, name) in OWN_TYPES.items():
        cls = getattr(importlib.import_module(module), name)
        assert cls.get_description(), f"{slug} has no description"
        bare += _fields_without_words(cls.model_json_schema(), slug)
    assert bare == []
