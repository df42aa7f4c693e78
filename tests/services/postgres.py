"""A throwaway PostgreSQL cluster: initdb in a temporary folder, a loopback port, removed afterwards.

PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` system user
(Debian's package creates it) and every server command runs through `runuser`. The unix socket
lives in the cluster's own folder, so no system socket directory or system cluster is touched.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.ports import free_port


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine; `./dev test` installs them."""


@dataclass(frozen=True)
class Postgres:
    """A running cluster: where it listens and how to reach its one database."""

    host: str
    port: int
    user: str
    database: str
    folder: Path

    def url(self, driver: str = "postgresql+asyncpg") -> str:
        return f"{driver}://{self.user}@{self.host}:{self.port}/{self.database}"

    def psql(self, sql: str) -> str:
        """Run `sql` with psql over TCP and return its unaligned, tuples-only output."""
        done = subprocess.run(
            [_binary("psql"), "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", self.database,
             "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True, text=True, check=True, timeout=60,
        )
        return done.stdout.strip()


def _binary(name: str) -> str:
    """A PostgreSQL program: Debian keeps the server ones in /usr/lib/postgresql/<version>/bin."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=_version_key, reverse=True)
    if found:
        return found[0]
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise PostgresUnavailable(f"PostgreSQL's {name} is not installed; `./dev test` installs the postgresql package")


def _version_key(path: str) -> int:
    version = Path(path).parts[-3]
    return int(version) if version.isdigit() else 0


def _as_owner(owner: str | None, argv: list[str]) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@contextlib.contextmanager
def postgres_cluster(database: str = "prefect", user: str = "prefect") -> Iterator[Postgres]:
    """Start a fresh cluster with one database; stop it and delete its folder on exit."""
    owner = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="trainguard-pg-"))
    if owner:
        entry = pwd.getpwnam(owner)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    data, port = folder / "data", free_port()
    started = False
    try:
        _run(_as_owner(owner, [_binary("initdb"), "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8"]))
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        _run(_as_owner(owner, [_binary("pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"),
                               "-w", "-t", "60", "start"]))
        started = True
        _run([_binary("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, database])
        yield Postgres("127.0.0.1", port, user, database, folder)
    finally:
        if started:
            subprocess.run(_as_owner(owner, [_binary("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        program = Path(argv[4] if argv[0] == "runuser" else argv[0]).name
        raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
