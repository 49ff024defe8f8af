"""A throwaway PostgreSQL 15 cluster for tests, with pg_cron, pg_net and Supabase Vault
preloaded (pg_net and Vault are built from source by scripts/setup).

initdb and pg_ctl refuse to run as root, and CI runs as root, so when we are root every
server command runs as the `postgres` user and the cluster lives in a directory that user
owns. (pytest-postgresql runs pg_ctl as the calling user inside pytest's 0700 temp dir,
which is why this small class exists instead.)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))

# Vault's root key, which the server reads at start from `vault.getkey_script`: a fixed
# throwaway key (64 hex characters), good for test clusters only.
VAULT_ROOT_KEY = hashlib.sha256(b"pgqueue-template test clusters only").hexdigest()

# Test clusters trade durability for speed; benchmarks pass their own settings.
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}
BASE_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "shared_preload_libraries": "'pg_cron,pg_net,supabase_vault'",
    "cron.database_name": "'postgres'",
    # pg_net's one background worker sends the requests queued in this database only
    "pg_net.database_name": "'postgres'",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@dataclass
class Cluster:
    """A PostgreSQL server on 127.0.0.1:<port> with trust auth for every role.

    `superuser` is the role initdb creates, which dsn() and connect() log in as unless told
    otherwise: `postgres` on a plain cluster, `supabase_admin` on a hosted-shaped one
    (testkit/hosted.py), where `postgres` is not a superuser. url(), what the Supabase CLI is
    given, always logs in as `postgres`, as the CLI does on a hosted project."""

    settings: dict[str, str] = field(default_factory=lambda: dict(FAST_SETTINGS))
    port: int = field(default_factory=free_port)
    superuser: str = "postgres"
    root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pgqueue-cluster-"))
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o755)

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.superuser}@127.0.0.1:{self.port}/{dbname}"

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """The connection URL the Supabase CLI wants: as `postgres`, the role `supabase db push`
        logs in as on a hosted project too, and no TLS on a local server."""
        return f"{self.dsn(dbname, user)}?sslmode=disable"

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run(_as_postgres(list(cmd)), capture_output=True, text=True)
        if proc.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}\n{log}")

    def init(self) -> Cluster:
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            self.superuser,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )
        self.write_settings()
        return self

    def write_settings(self) -> None:
        """Write postgresql.auto.conf: BASE_SETTINGS, this cluster's settings over them, then
        what belongs to this cluster only (its port, socket folder and Vault key script). A
        data directory copied from another cluster's gets this one's settings the same way."""
        conf = {**BASE_SETTINGS, **self.settings, "port": str(self.port)}
        conf["unix_socket_directories"] = f"'{self.root}'"
        conf["vault.getkey_script"] = f"'{self._write_getkey_script()}'"
        (self.datadir / "postgresql.auto.conf").write_text(
            "".join(f"{k} = {v}\n" for k, v in conf.items())
        )

    def _write_getkey_script(self) -> Path:
        """An executable that prints Vault's root key, readable by the server's user only."""
        script = self.root / "vault-getkey"
        script.write_text(f"#!/bin/sh\necho {VAULT_ROOT_KEY}\n")
        script.chmod(0o700)
        if os.geteuid() == 0:
            shutil.chown(script, "postgres", "postgres")
        return script

    def start(self) -> Cluster:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile), "-w", "start"
        )
        self.wait_ready()
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def connect(
        self, dbname: str = "postgres", user: str | None = None, **kwargs
    ) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname, user), **kwargs)
