"""A PostgreSQL cluster shaped like a hosted Supabase database: supautils preloaded and
Supabase's own role set-up applied (supabase/postgres at SUPABASE_POSTGRES_COMMIT), so that
`postgres` is not a superuser and creates pg_cron and pg_net only through supautils, as on a
hosted project. `supabase_admin` is the superuser. docs/testing.md says which tests run on it.

The recipe is the one in ../shared/vendor/README.md, the way supabase/postgres's
`migrations/db/migrate.sh` runs it: initdb as `supabase_admin`; `create role postgres
superuser login` and give it the database; the init scripts as `postgres`; the migrations as
`supabase_admin` (the first of them demotes `postgres`). Three statements of them fail here
(EXPECTED_FAILURES) and are left; any other failure, or one of those no longer failing, stops
the build, so a change in what applies is seen. Then, as `supabase_admin`: Vault created, as
a hosted project has it, with the grants Supabase makes for Vault 0.3 (sql/hosted_vault.sql);
the auth helpers as GoTrue's own migrations leave them (sql/auth_functions.sql); and
pg-safeupdate, which Supabase has PostgREST's `authenticator` load and which is not installed
here, taken out of that role's settings (else it could not log in).

Building takes under 2 s here (initdb and the set-up's scripts); copying a built, stopped data
directory takes about 0.2 s, so each process builds one and every hosted cluster starts from a
copy of it.

scripts/setup builds supautils and unpacks the supabase/postgres files into
SUPABASE_POSTGRES.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import threading
from pathlib import Path

from .cluster import FAST_SETTINGS, PG_BIN, Cluster, _as_postgres

REPO = Path(__file__).resolve().parents[1]
SQL = Path(__file__).parent / "sql"

SUPABASE_POSTGRES_COMMIT = "7db7e1a9e34b9ffb9b0e3372ccf08eb4fa772f4b"
SUPABASE_POSTGRES = REPO / ".cache" / f"supabase-postgres-{SUPABASE_POSTGRES_COMMIT[:8]}"
INIT_SCRIPTS = SUPABASE_POSTGRES / "migrations/db/init-scripts"
MIGRATIONS = SUPABASE_POSTGRES / "migrations/db/migrations"
SUPAUTILS_CONF = SUPABASE_POSTGRES / "ansible/files/postgresql_config/supautils.conf.j2"
CUSTOM_SCRIPTS = SUPABASE_POSTGRES / "ansible/files/postgresql_extension_custom_scripts"

SUPERUSER = "supabase_admin"
PRELOAD = "'supautils,pg_cron,pg_net,supabase_vault'"

# (script, error) of each statement of Supabase's set-up that fails here, and why it may:
EXPECTED_FAILURES = {
    # pgjwt is not packaged for Debian's PostgreSQL 15, nor used by the queue
    ("00000000000000-initial-schema.sql", 'extension "pgjwt" is not available'),
    # pgsodium is not installed, so the role its extension creates does not exist
    ("20230529180330_alter_api_roles_for_inherit.sql", 'role "pgsodium_keyholder" does not exist'),
    # the event trigger that grants `postgres` pg_cron's objects: its function belongs to
    # `postgres`, no longer a superuser, and supautils refuses a superuser's event trigger
    # that runs one (the grants come from supautils' pg_cron/after-create.sql instead)
    (
        "20231020085357_revoke_writes_on_cron_job_from_postgres.sql",
        "Superuser owned event trigger must execute a superuser owned function",
    ),
}

_lock = threading.Lock()
_template: Cluster | None = None


class HostedSetupError(RuntimeError):
    """Supabase's role set-up did not apply as it does on this machine's known-good build."""


def start_hosted_cluster(**settings: str) -> Cluster:
    """A started hosted-shaped cluster of its own (a copy of this process's built one).
    dsn() and connect() log in as `supabase_admin`; url(), for the Supabase CLI, as
    `postgres`. `settings` go over FAST_SETTINGS, as for Cluster."""
    template = _built_template()
    cluster = Cluster(settings={**FAST_SETTINGS, **settings}, superuser=SUPERUSER)
    _copy_as_server_user(template.datadir, cluster.datadir)
    _configure(cluster)
    return cluster.start()


def _configure(cluster: Cluster) -> None:
    """supautils' settings, from Supabase's own supautils.conf, with the custom scripts in
    this cluster's folder."""
    scripts = cluster.root / "extension-custom-scripts"
    if not scripts.exists():
        _copy_as_server_user(CUSTOM_SCRIPTS, scripts)
    cluster.settings = {
        **supautils_settings(scripts),
        "shared_preload_libraries": PRELOAD,
        **cluster.settings,
    }
    cluster.write_settings()


def supautils_settings(custom_scripts: Path) -> dict[str, str]:
    """The lines of supabase/postgres's supautils.conf.j2 (it has no template variables), the
    custom scripts folder pointed at `custom_scripts`.

    supautils 3.4 reads that folder from `supautils.extension_custom_scripts_path` (without it
    pg_cron's after-create grants never run) and still defines the file's older name,
    `supautils.privileged_extensions_custom_scripts_path`, over the same variable: with both
    set, every configuration reload frees the value twice and the postmaster aborts
    ("free(): double free detected"). So the older name is replaced, not kept."""
    if not SUPAUTILS_CONF.exists():
        raise HostedSetupError(
            f"{SUPAUTILS_CONF} is missing: scripts/setup unpacks supabase/postgres's set-up there"
        )
    conf = {}
    for line in SUPAUTILS_CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, value = (part.strip() for part in line.split("=", 1))
            conf[name] = value
    del conf["supautils.privileged_extensions_custom_scripts_path"]
    conf["supautils.extension_custom_scripts_path"] = f"'{custom_scripts}'"
    return conf


def _copy_as_server_user(src: Path, dest: Path) -> None:
    proc = subprocess.run(
        _as_postgres(["cp", "-a", str(src), str(dest)]), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"copying {src} to {dest} failed: {proc.stderr}")


def _built_template() -> Cluster:
    """This process's hosted-shaped data directory, built on first use, stopped."""
    global _template
    with _lock:
        if _template is None:
            _template = build_hosted_cluster()
            _template.stop()
            atexit.register(_template.destroy)
        return _template


def build_hosted_cluster(
    expected_failures: set[tuple[str, str]] = EXPECTED_FAILURES,
) -> Cluster:
    """Build a hosted-shaped cluster from scratch (initdb and Supabase's set-up) and leave it
    running; HostedSetupError if the statements that fail are not exactly
    `expected_failures`. start_hosted_cluster() copies one such build instead, which is much
    faster."""
    cluster = Cluster(superuser=SUPERUSER).init()
    _configure(cluster)
    cluster.start()
    try:
        psql(cluster, SUPERUSER, sql="create role postgres superuser login;"
             " alter database postgres owner to postgres;")  # fmt: skip
        failures = []
        for script in sorted(INIT_SCRIPTS.glob("*.sql")):
            failures += psql(cluster, "postgres", script)
        for script in sorted(MIGRATIONS.glob("*.sql")):
            failures += psql(cluster, SUPERUSER, script)
        unexpected = sorted(set(failures) - expected_failures)
        missing = sorted(expected_failures - set(failures))
        if unexpected or missing:
            raise HostedSetupError(
                "Supabase's role set-up did not apply as expected:\n"
                + "".join(f"  failed: {script}: {error}\n" for script, error in unexpected)
                + "".join(f"  no longer fails: {script}: {error}\n" for script, error in missing)
            )
        with cluster.connect(autocommit=True) as conn:
            # a hosted project has Vault from the start; the queue's migrations create the rest
            conn.execute("create extension if not exists supabase_vault cascade")
            conn.execute((SQL / "hosted_vault.sql").read_text())
            conn.execute((SQL / "auth_functions.sql").read_text())
            # Supabase has PostgREST's login role load pg-safeupdate (UPDATE and DELETE
            # without WHERE refused), which is not installed here: the role could not log in
            conn.execute("alter role authenticator reset session_preload_libraries")
    except BaseException:
        cluster.destroy()
        raise
    return cluster


ERROR_LINE = re.compile(r"^psql:(?P<file>[^:]+):\d+: ERROR:\s+(?P<error>.*)$", re.MULTILINE)


def psql(
    cluster: Cluster, user: str, script: Path | None = None, sql: str | None = None
) -> list[tuple[str, str]]:
    """Run a script (or `sql`) with psql as `user`, on past errors as migrate.sh's statements
    are left here; return each failed statement as (script name, error message)."""
    source = ["-f", str(script)] if script else ["-c", sql or ""]
    proc = subprocess.run(
        [str(PG_BIN / "psql"), "-X", "-q", "-d", cluster.dsn(user=user), *source],
        capture_output=True,
        text=True,
        env={**os.environ, "PGOPTIONS": "--client-min-messages=error"},
    )
    if script is None:
        if proc.returncode != 0:
            raise HostedSetupError(f"{sql} failed: {proc.stderr}")
        return []
    return [(Path(m["file"]).name, m["error"]) for m in ERROR_LINE.finditer(proc.stderr)]
