"""Accounting for the test cluster: MariaDB and slurmdbd on loopback, in a throwaway folder.

MariaDB (`mariadb-server-core`) starts on an empty datadir with `--skip-grant-tables`: there are
no users to create, so `mariadb-install-db` (several seconds) is not needed, and only loopback can
reach it. InnoDB is sized small and does not sync, since the data is thrown away with the folder.
slurmdbd (`slurmdbd`, `slurm-wlm-mysql-plugin`) keeps its tables there and authenticates through
the cluster's own munged. `sacct` then has the record of every job and step.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARIADBD = "/usr/sbin/mariadbd"


def missing_binaries() -> list[str]:
    """What accounting needs that is not installed (./dev test installs it)."""
    plugin = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/accounting_storage_mysql.so")
    found = {"mariadbd": Path(MARIADBD).is_file(), "slurmdbd": Path("/usr/sbin/slurmdbd").is_file(),
             "accounting_storage_mysql (slurm-wlm-mysql-plugin)": plugin.is_file() or _plugin_elsewhere()}
    return [name for name, present in found.items() if not present]


def _plugin_elsewhere() -> bool:
    return any(Path("/usr/lib").glob("*/slurm*/accounting_storage_mysql.so"))


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@dataclass
class Accounting:
    """MariaDB's folder and the two private ports; the cluster starts the daemons from these argv and files."""

    root: Path
    mariadb_port: int
    dbd_port: int

    @property
    def datadir(self) -> Path:
        return self.root / "mariadb"

    def slurm_conf_lines(self, munge_socket: Path) -> list[str]:
        """slurm.conf's part: jobs and steps go to slurmdbd, which is reached through this munged."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={munge_socket}",  # the munged to use for slurmdbd (not the system's)
        ]

    def write_dbd_conf(self, conf_dir: Path, munge_socket: Path, log_dir: Path, run_dir: Path) -> None:
        """slurmdbd.conf beside slurm.conf (slurmdbd finds it through SLURM_CONF), mode 0600 as it demands."""
        path = conf_dir / "slurmdbd.conf"
        path.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}", "DbdHost=localhost", "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}", "SlurmUser=root", "DebugLevel=info",
            f"LogFile={log_dir}/slurmdbd.log", f"PidFile={run_dir}/slurmdbd.pid",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={self.mariadb_port}",
            "StorageUser=root", "StorageLoc=slurm_acct_db", "",
        ]))
        path.chmod(0o600)

    def mariadb_argv(self) -> list[str]:
        d = self.datadir
        d.mkdir(parents=True, exist_ok=True)
        return [
            MARIADBD, "--no-defaults", "--user=root", f"--datadir={d}", f"--socket={self.root}/mysqld.sock",
            f"--port={self.mariadb_port}", "--bind-address=127.0.0.1", f"--pid-file={self.root}/mysqld.pid",
            "--skip-grant-tables", f"--log-error={self.root}/mariadb.log", "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=8M", "--innodb-data-file-path=ibdata1:4M:autoextend",
            "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--innodb-flush-method=nosync",
            "--skip-log-bin", "--skip-name-resolve",
        ]

    def wait_ready(self, what: str, port: int, alive: Callable[[], None], timeout: float = 60.0) -> None:
        """Wait until `port` accepts connections; `alive` raises when a daemon died meanwhile."""
        deadline = time.monotonic() + timeout
        while not listening(port):
            alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g}s "
                                   f"(see {self.root} and the cluster's log folder)")
            time.sleep(0.05)
