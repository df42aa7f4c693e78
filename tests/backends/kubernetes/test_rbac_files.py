"""The RBAC files as an API server would read them: what they grant about Secrets.

Which calls the flow makes is checked against `rbac.yaml` where the calls are made (tests/rbac_check.py,
used by the adapter and flow tests); these read the files themselves for what no test run makes:
the worker's account needs no Secret by default, and the flow's may write Secrets but never read one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOYMENTS = Path(__file__).resolve().parents[3] / "deployments" / "kubernetes"


def _rules(path: Path, resource: str) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [rule for doc in docs if doc["kind"] in ("Role", "ClusterRole") for rule in doc["rules"]
            if resource in rule["resources"] or "*" in rule["resources"]]


def test_the_workers_account_is_granted_no_secret_by_default() -> None:
    assert _rules(DEPLOYMENTS / "worker-rbac.yaml", "secrets") == []


def test_the_opt_in_for_the_workers_api_key_secret_names_the_one_secret_wherever_kubernetes_allows() -> None:
    rules = _rules(DEPLOYMENTS / "worker-api-key-secret-rbac.yaml", "secrets")
    by_verb = {verb: rule.get("resourceNames") for rule in rules for verb in rule["verbs"]}
    assert set(by_verb) == {"create", "get", "update", "delete"}
    # RBAC cannot narrow create by name (the object has none yet when it is authorized)
    assert by_verb["create"] is None
    assert all(by_verb[verb] == ["prefect-trainguard-worker-api-key"] for verb in ("get", "update", "delete"))


def test_the_flows_account_may_create_secrets_and_do_nothing_else_with_them() -> None:
    rules = _rules(DEPLOYMENTS / "rbac.yaml", "secrets")
    assert [rule["verbs"] for rule in rules] == [["create"]]
