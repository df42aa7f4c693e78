"""PATCH bodies: JSON Patch (RFC 6902), JSON Merge Patch (RFC 7386) and strategic merge.

Strategic merge knows only the merge keys the project's objects use; server-side apply is
approximated as a strategic merge. Which body type applies is decided by the server.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.errors import BadRequest, UnsupportedMediaType

# Lists merged element-wise by a key instead of replaced (from the Go types' patchMergeKey).
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "imagePullSecrets": "name",
    "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type",
    "containerStatuses": "name", "initContainerStatuses": "name",
    "ownerReferences": "uid", "addresses": "type", "tolerations": None, "taints": None,
}
SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise BadRequest(f"the server rejected our request due to an error in our request: "
                         f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def _json_patch_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op.get("op"), _pointer(op.get("path", ""))
    if kind in ("move", "copy"):
        src_parent, src_key = _parent(doc, _pointer(op["from"]))
        value = src_parent[int(src_key)] if isinstance(src_parent, list) else src_parent[src_key]
        if kind == "move":
            doc = _json_patch_op(doc, {"op": "remove", "path": op["from"]})
        return _json_patch_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        if kind in ("add", "replace"):
            return copy.deepcopy(op["value"])
        if kind == "test" and doc == op["value"]:
            return doc
        raise BadRequest(f"unsupported json patch op on the document root: {kind}")
    parent, key = _parent(doc, parts)
    if isinstance(parent, list):
        index = len(parent) if key == "-" else int(key)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "remove":
            parent.pop(index)
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        elif kind == "test" and parent[index] != op["value"]:
            raise BadRequest(f"testing value {op['path']} failed")
        return doc
    if kind in ("add", "replace"):
        if kind == "replace" and key not in parent:
            raise BadRequest(f"replace operation does not apply: doc is missing key: {op['path']}")
        parent[key] = copy.deepcopy(op["value"])
    elif kind == "remove":
        if key not in parent:
            raise BadRequest(f"remove operation does not apply: doc is missing key: {op['path']}")
        del parent[key]
    elif kind == "test":
        if parent.get(key) != op["value"]:
            raise BadRequest(f"testing value {op['path']} failed")
    else:
        raise BadRequest(f"unexpected kind of json patch operation: {kind!r}")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902, all six operations; a failing op fails the whole patch."""
    if not isinstance(ops, list):
        raise BadRequest("json patch body must be a list of operations")
    doc = copy.deepcopy(target)
    try:
        for op in ops:
            doc = _json_patch_op(doc, op)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise BadRequest(f"json patch could not be applied: {exc}") from exc
    return doc


def _merge_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    if field in SET_LISTS:
        return list(dict.fromkeys([*target, *[p for p in patch if p is not None]]))
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return copy.deepcopy([p for p in patch if not (isinstance(p, dict) and "$patch" in p)])
    result = copy.deepcopy(target)
    for item in patch:
        if item.get("$patch") == "replace":
            return copy.deepcopy([p for p in patch if p.get("$patch") != "replace"])
        index = next((i for i, r in enumerate(result)
                      if isinstance(r, dict) and r.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(strategic_merge({}, item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    """Strategic merge patch with the merge keys of MERGE_KEYS and `$patch` directives."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


PATCH_TYPES = {
    "application/json-patch+json": json_patch,
    "application/merge-patch+json": merge_patch,
    "application/strategic-merge-patch+json": strategic_merge,
    "application/apply-patch+yaml": strategic_merge,
}


def apply(content_type: str, target: dict[str, Any], body: Any) -> dict[str, Any]:
    """Apply a PATCH body of the given Content-Type to target; returns a new object."""
    kind = content_type.split(";")[0].strip()
    fn = PATCH_TYPES.get(kind)
    if fn is None:
        raise UnsupportedMediaType(f"the body of the request was in an unknown format - "
                                   f"accepted media types include: {', '.join(PATCH_TYPES)}")
    result = fn(target, body)
    if not isinstance(result, dict):
        raise BadRequest("the patch did not produce an object")
    return result
