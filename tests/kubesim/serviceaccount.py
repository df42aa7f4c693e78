"""In-cluster access for containers: the API's HTTPS endpoint and the service-account files.

What belongs here: the cluster's own CA and the serving certificate of the in-cluster HTTPS
endpoint (made once per server, EC P-256, valid for 127.0.0.1/localhost/kubernetes.default.svc),
and the files the kubelet puts at /var/run/secrets/kubernetes.io/serviceaccount in every
container, as the ServiceAccount admission plugin's projected `kube-api-access-*` volume does:
`token`, `ca.crt` (the kube-root-ca.crt ConfigMap's) and `namespace`. So the official clients'
in-cluster loaders (`load_incluster_config`) work unchanged inside a pod:
`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the CA, and the bearer token.

Deviations, on purpose: the volume is not written into the pod spec (kubectl describe and the
project's describe output stay as they are), the token is an opaque string that kubesim accepts
like any other (no authentication), and the files exist only where containers get a private
mount namespace (root); elsewhere the path cannot be bound, and in-cluster config is unavailable.

What does not: the listeners (server.py) and the container's other mounts (workload.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubesim.store import Store

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
_VALID_DAYS = 2


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """Make the cluster CA and the API's serving certificate; (ca.crt, tls.crt, tls.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(_name("kubernetes")).issuer_name(_name("kubernetes"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                         critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    names = [x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                        "kubernetes.default.svc")]
    serving = (x509.CertificateBuilder().subject_name(_name("kube-apiserver")).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
               .add_extension(x509.SubjectAlternativeName(
                   [*names, x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                              critical=False)
               .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "tls.crt", folder / "tls.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def server_context(certificate: Path, key: Path) -> ssl.SSLContext:
    """The TLS context of the in-cluster endpoint."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)
    return context


def automounts(pod: Mapping[str, Any], account: Mapping[str, Any] | None) -> bool:
    """Whether the pod gets the token: the pod's automountServiceAccountToken wins, then the
    ServiceAccount's, else true (as the admission plugin decides)."""
    spec_value = (pod.get("spec") or {}).get("automountServiceAccountToken")
    if spec_value is not None:
        return bool(spec_value)
    account_value = (account or {}).get("automountServiceAccountToken")
    return True if account_value is None else bool(account_value)


def user_of(headers: Mapping[str, str]) -> str:
    """Who a request says it is, as an audit log names it (the token is not checked)."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "system:anonymous"
    parts = token.split(":")
    if len(parts) == 4 and parts[0] == "kubesim":
        return f"system:serviceaccount:{parts[1]}:{parts[2]}"
    return token if token == "kubesim" else "bearer"


def write_files(folder: Path, pod: Mapping[str, Any], ca_certificate: Path) -> Path:
    """The service-account folder for one pod: token, ca.crt, namespace."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    folder.mkdir(parents=True, exist_ok=True)
    account = spec.get("serviceAccountName") or "default"
    (folder / "token").write_text(f"kubesim:{meta['namespace']}:{account}:{meta.get('uid', '')}")
    (folder / "ca.crt").write_bytes(ca_certificate.read_bytes())
    (folder / "namespace").write_text(meta["namespace"])
    return folder


def bind(binds: dict[str, Path], store: Store, pod: Mapping[str, Any], root: Path,
         pod_dir: Path) -> None:
    """Add the service-account folder to a container's binds, unless the pod opts out or the
    container mounts something at that path itself."""
    spec = pod.get("spec") or {}
    account = store.get("serviceaccounts", pod["metadata"]["namespace"],
                        spec.get("serviceAccountName") or "default")
    ca = root / "pki" / "ca.crt"
    if MOUNT_PATH in binds or not ca.exists() or not automounts(pod, account):
        return
    binds[MOUNT_PATH] = write_files(pod_dir / "serviceaccount", pod, ca)
