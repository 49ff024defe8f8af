"""A queue's schema as the database holds it, to compare two projects: every table, column,
index, constraint, function, view, trigger, comment, grant and policy of the queue's schema and
of its `<schema>_public` (pg_dump, schema only) and the queue's pg_cron jobs, split into one
entry per object."""

from __future__ import annotations

import re
import subprocess

from testkit.cluster import PG_BIN, Cluster

# pg_dump starts each object with a comment naming it:
#   -- Name: backoff(integer); Type: FUNCTION; Schema: pgqueue; Owner: postgres
HEADER = re.compile(r"^-- Name: (.+?); Type: (.+?); Schema: (.*?); .*$", re.MULTILINE)

# True for a function (`p`, a pg_proc row) that pins search_path = pg_catalog, pg_temp first, or
# is the one kind that may leave it alone: an internal (`_`-named) SQL function, not SECURITY
# DEFINER, without settings. PostgreSQL inlines it into the query that calls it, whose
# function pins the path (a function with a SET clause is never inlined). The same predicate is
# in the project's pgTAP suite (template/supabase/tests/database/queue.test.sql.jinja).
PINS_ITS_PATH = (
    "coalesce(p.proconfig[1] = 'search_path=pg_catalog, pg_temp', false)"
    " or (p.proname like '\\_%' and p.prolang = (select l.oid from pg_catalog.pg_language as l"
    " where l.lanname = 'sql') and not p.prosecdef and p.proconfig is null)"
)


def queue_schema(cluster: Cluster, schema: str) -> dict[str, str]:
    """{"FUNCTION backoff(integer)": its definition, ...} (an object of `<schema>_public`
    named with its schema), the cron jobs under "CRON", and under "CONFIG" what the
    configuration holds for the worker style and transport."""
    dump = subprocess.run(
        [
            PG_BIN / "pg_dump",
            "--schema-only",
            "--schema",
            schema,
            "--schema",
            f"{schema}_public",
            cluster.dsn(),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # pg_dump 15.14+ brackets its output in \restrict lines with a random key
    dump = re.sub(r"^\\(un)?restrict .*$", "", dump, flags=re.MULTILINE)
    headers = list(HEADER.finditer(dump))
    objects = {}
    for header, after in zip(headers, [*headers[1:], None], strict=True):
        body = dump[header.end() : after.start() if after else len(dump)]
        name, kind, in_schema = header.groups()
        key = f"{kind} {name}" if in_schema in (schema, "-") else f"{kind} {in_schema}.{name}"
        assert key not in objects, f"two objects named {key}"
        objects[key] = "\n".join(line for line in body.splitlines() if line.strip("- "))
    with cluster.connect() as conn:
        jobs = conn.execute(
            "select jobname, schedule, command, database, username from cron.job"
            " where jobname like %s order by jobname",
            (f"{schema}-%",),
        ).fetchall()
        # (a release before 1.0.0 has no config table)
        (has_config,) = conn.execute(
            "select to_regclass(%s) is not null", (f"{schema}.config",)
        ).fetchone()
        config = None
        if has_config:
            (config,) = conn.execute(f"select to_jsonb(c) from {schema}.config as c").fetchone()
    objects["CRON"] = repr(jobs)
    if config is not None:
        # what the migrations seed from the worker style and transport (the other settings
        # come from answers whose defaults changed between releases, which a project keeps)
        style = ("notify_listeners", "workers_poll")
        objects["CONFIG"] = repr({k: config.get(k) for k in style})
    return objects


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The objects that only one side has, or that the two define differently."""

    def how(name: str) -> str:
        if name not in b:
            return "only in the first"
        return "only in the second" if name not in a else "differs"

    return sorted(
        f"{name}: {how(name)}" for name in a.keys() | b.keys() if a.get(name) != b.get(name)
    )
