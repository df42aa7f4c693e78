"""PATCH semantics: RFC 6902 operations, RFC 7386 nulls, and strategic merge by merge keys."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim import patch
from kubesim.errors import BadRequest, UnsupportedMediaType

POD = {"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "j"}]},
       "spec": {"containers": [{"name": "x", "image": "i:1", "env": [{"name": "A", "value": "1"}]},
                               {"name": "y", "image": "i:2"}],
                "volumes": [{"name": "v", "emptyDir": {}}]}}


@pytest.mark.parametrize(("body", "check"), [
    ({"spec": {"containers": [{"name": "y", "image": "i:3"}]}},
     lambda r: [c["image"] for c in r["spec"]["containers"]] == ["i:1", "i:3"]),
    ({"spec": {"containers": [{"name": "x", "env": [{"name": "B", "value": "2"}]}]}},
     lambda r: [e["name"] for e in r["spec"]["containers"][0]["env"]] == ["A", "B"]),
    ({"spec": {"containers": [{"name": "x", "$patch": "delete"}]}},
     lambda r: [c["name"] for c in r["spec"]["containers"]] == ["y"]),
    ({"spec": {"volumes": [{"name": "w", "emptyDir": {}}, {"$patch": "replace"}]}},
     lambda r: [v["name"] for v in r["spec"]["volumes"]] == ["w"]),
    ({"metadata": {"finalizers": ["b", "a"]}}, lambda r: r["metadata"]["finalizers"] == ["a", "b"]),
    ({"metadata": {"ownerReferences": [{"uid": "1", "controller": True}]}},
     lambda r: r["metadata"]["ownerReferences"] == [{"uid": "1", "name": "j",
                                                     "controller": True}]),
    ({"spec": {"volumes": None}}, lambda r: "volumes" not in r["spec"]),
])
def test_strategic_merge_uses_merge_keys_and_directives(body: dict[str, Any], check: Any) -> None:
    assert check(patch.apply("application/strategic-merge-patch+json", POD, body))


def test_merge_patch_replaces_lists_and_deletes_nulls() -> None:
    result = patch.apply("application/merge-patch+json", POD,
                         {"spec": {"containers": [{"name": "z"}]}, "metadata": {"finalizers": None}})
    assert result["spec"]["containers"] == [{"name": "z"}]
    assert "finalizers" not in result["metadata"]


@pytest.mark.parametrize(("ops", "check"), [
    ([{"op": "add", "path": "/metadata/finalizers/-", "value": "b"}],
     lambda r: r["metadata"]["finalizers"] == ["a", "b"]),
    ([{"op": "remove", "path": "/spec/containers/0"}],
     lambda r: [c["name"] for c in r["spec"]["containers"]] == ["y"]),
    ([{"op": "move", "from": "/spec/volumes", "path": "/metadata/vols"}],
     lambda r: "volumes" not in r["spec"] and r["metadata"]["vols"][0]["name"] == "v"),
    ([{"op": "copy", "from": "/spec/containers/1/image", "path": "/metadata/image"}],
     lambda r: r["metadata"]["image"] == "i:2"),
    ([{"op": "test", "path": "/spec/containers/1/name", "value": "y"},
      {"op": "replace", "path": "/spec/containers/1/name", "value": "w"}],
     lambda r: r["spec"]["containers"][1]["name"] == "w"),
])
def test_json_patch_operations(ops: list[dict[str, Any]], check: Any) -> None:
    result = patch.apply("application/json-patch+json", POD, ops)
    assert check(result)
    assert POD["metadata"]["finalizers"] == ["a"], "the target must not change"


@pytest.mark.parametrize("ops", [
    [{"op": "test", "path": "/spec/containers/1/name", "value": "nope"}],
    [{"op": "remove", "path": "/spec/missing"}],
    [{"op": "replace", "path": "/spec/missing", "value": 1}],
    [{"op": "frobnicate", "path": "/spec"}],
    {"op": "add"},
])
def test_a_failing_json_patch_is_a_bad_request(ops: Any) -> None:
    with pytest.raises(BadRequest):
        patch.apply("application/json-patch+json", POD, ops)


def test_an_unknown_patch_type_is_unsupported_media() -> None:
    with pytest.raises(UnsupportedMediaType) as err:
        patch.apply("application/xml", POD, {})
    assert err.value.code == 415
