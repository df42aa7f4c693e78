"""What a kubelet derives from a pod spec before it starts a container.

What belongs here: resource quantities, the image map (glob -> how to run), the command
line, the container environment (value, fieldRef, resourceFieldRef, secretKeyRef,
configMapKeyRef, envFrom, service and GPU variables), volume folders and the mount map.

Mounts: where the runtime can give a container a private mount namespace, each volume is
bound at its real mountPath. Everywhere (and as the only means where unshare is not
permitted) each mount is also exposed as `KUBESIM_MOUNT_<PATH>` and `KUBESIM_MOUNTS` (JSON);
without a namespace every command word, env value and workingDir that starts with a
mountPath is rewritten to the local folder, which is less faithful (a path built inside the
program is not rewritten) and is flagged by a warning.

What does not: process handling (runtime.py) and pod status (kubelet.py).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubesim.dns import hostname
from kubesim.store import Store

_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")


class ConfigError(Exception):
    """The pod's env cannot be built: the kubelet reports CreateContainerConfigError."""


class StartError(Exception):
    """The command cannot be started: the kubelet reports StartError (exit 128)."""


def quantity(value: object) -> Decimal:
    """Parse a Kubernetes resource quantity ("500m", "1Gi", "2") into a Decimal."""
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in ("", *_SUFFIXES):
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$', got {value!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES.get(match.group(2), 1))


def requests_of(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests of a pod: sum over containers, limits implying requests."""
    total: dict[str, Decimal] = {}
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for key, val in merged.items():
            total[key] = total.get(key, Decimal(0)) + quantity(val)
    for c in pod.get("spec", {}).get("initContainers", []) or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for key, val in merged.items():
            total[key] = max(total.get(key, Decimal(0)), quantity(val))
    return total


_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^{_DOMAIN}(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def image_error(image: str) -> str | None:
    """The kubelet's InvalidImageName message for an unparsable image name, else None.

    Follows distribution/reference ParseNormalizedNamed: the repository part is checked for
    upper case first, then the whole name against the reference grammar.
    """
    text = (f'Failed to apply default image tag "{image}": couldn\'t parse image name '
            f'"{image}": invalid reference format')
    first, slash, rest = image.partition("/")
    if not slash or (not any(ch in first for ch in ".:") and first != "localhost"
                     and first.lower() == first):
        remainder = image if slash else f"library/{image}"
    else:
        remainder = rest
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        return f"{text}: repository name ({remote}) must be lowercase"
    return None if _REFERENCE.match(image) else text


def resolve_image(images: Mapping[str, Any], image: str) -> Any | None:
    """The runtime an image name maps to; None when the image cannot be "pulled"."""
    if not images:
        return {"kind": "Host"}
    for pattern, runtime in images.items():
        if fnmatch.fnmatchcase(image, pattern):
            return runtime
    return None


def _executable(image_runtime: Any) -> str | None:
    if isinstance(image_runtime, Mapping):
        return image_runtime.get("executable")
    return getattr(image_runtime, "executable", None)


def image_workdir(image_runtime: Any) -> str:
    """The image's WORKDIR ("" for none): where a container without a workingDir starts."""
    if isinstance(image_runtime, Mapping):
        return str(image_runtime.get("workdir") or "")
    return str(getattr(image_runtime, "workdir", "") or "")


def build_argv(container: Mapping[str, Any], image_runtime: Any, env: Mapping[str, str],
               mounts: Mapping[str, Path], *, rewrite_paths: bool) -> tuple[str, ...]:
    """The command line: command + args with $(VAR) expanded (and mount paths rewritten
    when the container has no mount namespace of its own)."""
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    if not words:
        raise StartError("no command specified: kubesim images have no entrypoint; "
                         "set command or args in the container spec")
    words = [_expand(str(w), env) for w in words]
    if rewrite_paths:
        words = [rewrite(w, mounts) for w in words]
    executable = _executable(image_runtime)
    if executable and re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(words[0])):
        words[0] = executable
    if shutil.which(rewrite(words[0], mounts), path=env.get("PATH")) is None:
        raise StartError(
            f'failed to create containerd task: failed to create shim task: OCI runtime '
            f'create failed: runc create failed: unable to start container process: exec: '
            f'"{words[0]}": executable file not found in $PATH: unknown')
    return tuple(words)


def _expand(text: str, env: Mapping[str, str]) -> str:
    # Kubernetes expands $(VAR) from the container env and leaves unknown references as is.
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: env.get(m.group(1), m.group(0)), text)


def rewrite(text: str, mounts: Mapping[str, Path]) -> str:
    """Replace a leading mountPath by the local folder that stands for it."""
    for mount_path in sorted(mounts, key=len, reverse=True):
        if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
            return str(mounts[mount_path]) + text[len(mount_path.rstrip("/")):]
        for sep in ("=", ":"):
            head, found, tail = text.partition(sep + mount_path)
            if found and (tail == "" or tail.startswith("/")):
                return head + sep + str(mounts[mount_path]) + tail
    return text


def host_python_path(root: Path, image_runtime: Any) -> str | None:
    """For a HostPython image, what leads PATH: a folder whose python/python3 run that
    interpreter (so `sh -c "python ..."` and `#!/usr/bin/env python` find it), then the
    interpreter's own folder (so a venv's console scripts, e.g. `prefect`, are found).

    Scripts rather than symlinks: a symlinked venv interpreter would lose its venv.
    """
    executable = _executable(image_runtime)
    if not executable:
        return None
    folder = root / "shims" / hashlib.sha256(executable.encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        shim = folder / name
        if not shim.exists():
            shim.write_text(f'#!/bin/sh\nexec {shlex.quote(executable)} "$@"\n')
            shim.chmod(0o755)
    return f"{folder}:{Path(executable).parent}"


def build_env(store: Store, pod: Mapping[str, Any], container: Mapping[str, Any],
              extra: Mapping[str, str], *, path_prefix: str | None = None) -> dict[str, str]:
    """The container's environment; raises ConfigError for a missing Secret/ConfigMap key."""
    ns = pod["metadata"]["namespace"]
    env = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    env.update({"HOME": "/root", "HOSTNAME": hostname(pod), **extra})
    for source in container.get("envFrom") or []:
        env.update(_env_from(store, ns, source))
    for item in container.get("env") or []:
        value = _env_value(store, pod, container, item)
        if value is not None:
            env[item["name"]] = _expand(value, env)
    return env


def _env_from(store: Store, ns: str, source: Mapping[str, Any]) -> dict[str, str]:
    prefix = source.get("prefix", "")
    for kind, resource in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
        ref = source.get(kind)
        if ref is None:
            continue
        data = _data(store, resource, ns, ref["name"], ref.get("optional", False))
        return {prefix + k: v for k, v in (data or {}).items()}
    return {}


def _data(store: Store, resource: str, ns: str, name: str, optional: bool) -> dict[str, str] | None:
    obj = store.get(resource, ns, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{resource[:-1]} "{name}" not found')
    data = dict(obj.get("data") or {})
    if resource == "secrets":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        data.update(obj.get("stringData") or {})
    return data


def _env_value(store: Store, pod: Mapping[str, Any], container: Mapping[str, Any],
               item: Mapping[str, Any]) -> str | None:
    if "valueFrom" not in item:
        return str(item.get("value", ""))
    source = item["valueFrom"]
    ns = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_ref(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        return _resource_field(container, source["resourceFieldRef"])
    for kind, resource, label in (("secretKeyRef", "secrets", "Secret"),
                                  ("configMapKeyRef", "configmaps", "ConfigMap")):
        ref = source.get(kind)
        if ref is None:
            continue
        data = _data(store, resource, ns, ref["name"], ref.get("optional", False))
        if data is None or ref["key"] not in data:
            if ref.get("optional", False):
                return None
            raise ConfigError(f"couldn't find key {ref['key']} in {label} {ns}/{ref['name']}")
        return data[ref["key"]]
    return ""


def field_ref(pod: Mapping[str, Any], path: str) -> str:
    """Resolve a downward-API fieldPath against the pod."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP"),
    }
    return str(simple.get(path) or "")


def _resource_field(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        return "0"
    divisor = quantity(ref.get("divisor", "1"))
    return str(int(-(-quantity(value) // divisor)))


def prepare_volumes(store: Store, pod: Mapping[str, Any], pod_dir: Path,
                    root: Path) -> dict[str, Path]:
    """Create the local folder behind each pod volume; returns volume name -> folder."""
    ns = pod["metadata"]["namespace"]
    folders: dict[str, Path] = {}
    for volume in pod.get("spec", {}).get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            # One folder per claim that outlives pods: checkpoints survive attempts.
            path = root / "pvc" / ns / volume["persistentVolumeClaim"]["claimName"]
        elif "hostPath" in volume:
            path = root / "host" / volume["hostPath"]["path"].lstrip("/")
        else:
            path = pod_dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        for kind, resource, key in (("configMap", "configmaps", "name"),
                                    ("secret", "secrets", "secretName")):
            if kind in volume:
                ref = volume[kind]
                data = _data(store, resource, ns, ref[key], ref.get("optional", False))
                for fname, content in (data or {}).items():
                    _project(path / fname, content.encode("utf-8"))
                if kind == "configMap":  # binaryData files arrive as the decoded bytes
                    obj = store.get(resource, ns, ref[key]) or {}
                    for fname, encoded in (obj.get("binaryData") or {}).items():
                        _project(path / fname, base64.b64decode(encoded))
        folders[name] = path
    return folders


def _project(path: Path, data: bytes) -> None:
    """Put a ConfigMap or Secret key's file in place atomically, and only when it changed.

    Volumes are prepared again as each container (re)starts; a file rewritten in place while a
    running container of the same pod reads it would be cut short (the kubelet swaps a `..data`
    symlink for the same reason).
    """
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o644)  # a volume's defaultMode
    os.replace(tmp, path)


def mount_map(container: Mapping[str, Any], folders: Mapping[str, Path],
              container_dir: Path) -> dict[str, Path]:
    """mountPath -> local path for one container, plus its termination-message file."""
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        base = folders.get(mount["name"])
        if base is None:
            continue
        local = sub_path(base, mount, str(container.get("name"))) if mount.get("subPath") else base
        if not local.exists():
            local.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = local
    term_path = container.get("terminationMessagePath", "/dev/termination-log")
    mounts[term_path] = container_dir / "termination-log"
    return mounts


def sub_path(base: Path, mount: Mapping[str, Any], container: str) -> Path:
    """The folder (or file) a `subPath` mount binds, refusing one a symlink leads out of the volume.

    The kubelet creates a missing subPath folder and resolves the path inside the volume without
    leaving it (subpath.SafeMakeDir and PrepareSafeSubpath, the fix of CVE-2017-1002101); a path
    that escapes through a symlink fails the container with CreateContainerConfigError, in words
    that say nothing about the host's filesystem.
    """
    root = os.path.realpath(base)
    resolved = os.path.realpath(os.path.join(root, str(mount["subPath"])))
    if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
        raise ConfigError(f'failed to prepare subPath for volumeMount "{mount.get("name")}" '
                          f'of container "{container}"')
    return Path(resolved)


def mount_env(mounts: Mapping[str, Path]) -> dict[str, str]:
    """The documented variables through which a container finds its mounts."""
    env = {"KUBESIM_MOUNTS": json.dumps({k: str(v) for k, v in mounts.items()})}
    for mount_path, local in mounts.items():
        key = re.sub(r"[^A-Za-z0-9]", "_", mount_path.strip("/")).upper()
        env[f"KUBESIM_MOUNT_{key}"] = str(local)
    return env
