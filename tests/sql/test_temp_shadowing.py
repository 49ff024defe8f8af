"""No role reaches the queue owner's rights through its own temporary objects (issue 47,
finding 1). PostgreSQL looks up tables and types in the session's temporary schema *first*
unless `pg_temp` is named in the search_path (CREATE FUNCTION, "Writing SECURITY DEFINER
Functions Safely"); an empty search_path does not name it. A role that may only INSERT into an
app table whose trigger enqueues, or a signed-in user, creates a temporary domain named like
each type the queue's code names (its check calls the role's own function) and a temporary
view named like each catalog relation it names, then goes through each door it can reach: the
enqueuing trigger, `my_jobs`, `client_enqueue()` and `client_cancel()`. Their code never runs,
for every worker style, on a hosted-shaped database (`postgres` not a superuser) and on a
self-hosted one (`postgres` a superuser). The same objects do run the role's code inside a
SECURITY DEFINER function with the weak `search_path = ''`: the harness sees an attack that
works."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.project import (
    RELEASES,
    REPO,
    VARIANTS,
    Variant,
    push_migrations,
    release_refs,
    render,
    render_repo,
    supabase,
    update,
)
from testkit.stack import point_wake_ups, start_supabase_like_cluster, wait_for_pg_net

# Each worker style once (copier.yml's), with the postgres transport where there is one: its
# enqueues also NOTIFY, so the trigger's door runs the most of the queue's code.
STYLES: dict[str, Variant] = {}
for _variant in VARIANTS:
    if _variant.worker_style not in STYLES or _variant.claim_transport == "postgres":
        STYLES[_variant.worker_style] = _variant
SHAPES = ["hosted", "self-hosted"]
# The types the issue names; the test adds every catalog type named in the queue's code.
NAMED_TYPES = {"text", "jsonb", "uuid", "int8", "int4", "timestamptz", "bool", "tid", "name",
               "regclass", "bigint", "integer", "boolean", "interval", "bytea"}  # fmt: skip
# SQL's own spellings of types whose catalog names differ (a domain may not take these names,
# and the parser maps them to the catalog's: bigint is int8)
SPELLINGS = {"bigint": "int8", "integer": "int4", "int": "int4", "boolean": "bool",
             "smallint": "int2", "real": "float4"}  # fmt: skip
USER = "6a0c3c0e-6a53-4d2c-9d31-5f6cb0a1d001"

# The app's enqueuing trigger, exactly as docs/security.md has users write one: SECURITY
# DEFINER (the inserting role may not call enqueue()), pg_temp named, and last, in its path.
DOCS_TRIGGER = re.search(
    r"### Your own functions that enqueue\n.*?```sql\n(.*?)```",
    (REPO / "docs/security.md").read_text(),
    re.S,
)
assert DOCS_TRIGGER, "docs/security.md shows an enqueuing trigger"
APP_TRIGGER = (
    "create table public.orders (id bigint primary key, email text not null);\n" + DOCS_TRIGGER[1]
)
# What the role's domains and views call: a row in shadow_log says whose rights it ran with.
SHADOW_LOG = """
create table public.shadow_log (ran_as text, superuser bool, shadowed text);
grant insert, select on public.shadow_log to public;
"""
EVIL = """
create function pg_temp.evil(shadowed pg_catalog.text) returns pg_catalog.bool
language plpgsql as $$
begin
  insert into public.shadow_log
  select current_user, r.rolsuper, shadowed from pg_catalog.pg_roles as r
  where r.rolname = current_user;
  return true;
end;
$$
"""


def queue_code(conn: psycopg.Connection) -> str:
    """The text of every function the role's doors run: the queue's and auth's."""
    rows = conn.execute(
        "select pg_get_functiondef(p.oid) from pg_proc as p"
        " where p.pronamespace in"
        " ('pgqueue'::regnamespace, 'pgqueue_public'::regnamespace, 'auth'::regnamespace)"
        " and p.prokind = 'f'"
    ).fetchall()
    return "\n".join(text for (text,) in rows).lower()


def shadowable_types(conn: psycopg.Connection, code: str) -> list[str]:
    """The catalog's types the code names (and those the issue names), as a domain can shadow
    them: base and enum types, by their catalog names."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", code)) | NAMED_TYPES
    names = {SPELLINGS.get(word, word) for word in words}
    rows = conn.execute(
        "select t.typname from pg_type as t"
        " where t.typnamespace = 'pg_catalog'::regnamespace and t.typtype in ('b', 'e')"
        " and t.typname = any(%s) and t.typname not like '\\_%%'"
        " and t.typname not in ('unknown', 'cstring', 'aclitem', 'int2vector', 'oidvector')",
        (sorted(names),),
    ).fetchall()
    return sorted(name for (name,) in rows)


def shadowable_relations(conn: psycopg.Connection, code: str) -> list[str]:
    """The catalog's tables and views the code names."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", code))
    rows = conn.execute(
        "select c.relname from pg_class as c"
        " where c.relnamespace = 'pg_catalog'::regnamespace and c.relkind in ('r', 'v')"
        " and c.relname = any(%s)",
        (sorted(words),),
    ).fetchall()
    return sorted(name for (name,) in rows)


def plant(conn: psycopg.Connection, types: list[str], relations: list[str]) -> None:
    """In this session's temporary schema: a domain named like each type and a view named like
    each relation, each calling pg_temp.evil()."""
    conn.execute(EVIL)
    for name in types:
        conn.execute(
            sql.SQL("create domain pg_temp.{} as pg_catalog.{} check (pg_temp.evil({}))").format(
                sql.Identifier(name), sql.Identifier(name), sql.Literal(f"type {name}")
            )
        )
    for name in relations:
        conn.execute(
            sql.SQL(
                "create view pg_temp.{} as select * from pg_catalog.{} where pg_temp.evil({})"
            ).format(sql.Identifier(name), sql.Identifier(name), sql.Literal(f"relation {name}"))
        )


def ran(owner: psycopg.Connection) -> list[tuple]:
    return owner.execute("select ran_as, superuser, shadowed from public.shadow_log").fetchall()


ATTACKED = [(shape, style) for shape in SHAPES for style in STYLES.values()]


@pytest.fixture(scope="module", params=ATTACKED, ids=lambda p: f"{p[0]}-{p[1]}")
def attacked(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A cluster of the shape with a project of the style pushed as `postgres`, the app's
    enqueuing trigger, a role `mallory` that may only insert orders and act as a signed-in
    user, and a kind open to users. Wake-ups go to a closed port: wake() runs its whole path."""
    shape, style = request.param
    cluster = start_hosted_cluster() if shape == "hosted" else start_supabase_like_cluster()
    try:
        project = render(template, tmp_path_factory.mktemp("shadowed") / "app", **style.answers)
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as admin:
            admin.execute("update cron.job set active = false")
            point_wake_ups(admin, "http://127.0.0.1:9/wake", "wake-secret-of-the-shadow-test")
        # the app's own objects, as the project's owner (postgres) makes them
        with cluster.connect(user="postgres", autocommit=True) as owner:
            owner.execute(APP_TRIGGER)
            owner.execute(SHADOW_LOG)
            owner.execute(
                "create role mallory login;"
                " grant usage on schema public to mallory;"
                " grant insert on public.orders to mallory;"
                " grant authenticated to mallory"
            )
            owner.execute("select pgqueue.allow_client_kind('export_data', 1000)")
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def owner(attacked: Cluster) -> Iterator[psycopg.Connection]:
    with attacked.connect(user="postgres", autocommit=True) as conn:
        conn.execute("truncate public.shadow_log")
        yield conn


@pytest.fixture
def mallory(attacked: Cluster, owner: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """mallory's session, its temporary schema planted with a domain for every type and a view
    for every catalog relation the queue's code names."""
    code = queue_code(owner)
    types, relations = shadowable_types(owner, code), shadowable_relations(owner, code)
    assert {"text", "jsonb", "uuid", "int8", "timestamptz", "tid", "regclass"} <= set(types)
    with attacked.connect(user="mallory", autocommit=True) as conn:
        plant(conn, types, relations)
        yield conn


def as_signed_in_user(conn: psycopg.Connection) -> None:
    conn.execute("set role authenticated")
    claims = f'{{"sub": "{USER}", "role": "authenticated"}}'
    conn.execute("select set_config('request.jwt.claims', %s, false)", (claims,))


def test_an_enqueuing_trigger_runs_none_of_the_inserting_roles_code(
    attacked: Cluster, owner: psycopg.Connection, mallory: psycopg.Connection
) -> None:
    order = uuid.uuid4().int % 1_000_000
    mallory.execute("insert into public.orders values (%s, 'a@example.com')", (order,))
    wait_for_pg_net(owner)
    assert ran(owner) == []
    (jobs,) = owner.execute(
        "select count(*) from pgqueue.live_jobs where payload ->> 'to' = 'a@example.com'"
    ).fetchone()
    assert jobs == 1, "the insert went through the trigger and enqueued"


def test_a_signed_in_users_doors_run_none_of_their_code(
    owner: psycopg.Connection, mallory: psycopg.Connection
) -> None:
    as_signed_in_user(mallory)
    (job,) = mallory.execute(
        "select pgqueue_public.client_enqueue('export_data', '{\"n\": 1}', %s)",
        (f"shadow-{uuid.uuid4()}",),
    ).fetchone()
    mine = mallory.execute("select id, status from pgqueue_public.my_jobs").fetchall()
    (cancelled,) = mallory.execute("select pgqueue_public.client_cancel(%s)", (job,)).fetchone()
    assert ran(owner) == []
    assert (job, "queued") in mine
    assert cancelled


def test_the_same_objects_run_the_roles_code_where_pg_temp_is_left_out(
    owner: psycopg.Connection, mallory: psycopg.Connection
) -> None:
    """The harness sees an attack that works: a SECURITY DEFINER function of the owner's with
    the weak `search_path = ''` casts to text, and the role's check runs with the owner's
    rights."""
    owner.execute(
        "create function public.weak() returns int language plpgsql security definer"
        " set search_path = '' as $$ begin return length('x'::text); end; $$;"
        " grant execute on function public.weak() to mallory"
    )
    try:
        mallory.execute("select public.weak()")
        assert ("postgres", "type text") in [(who, what) for who, _, what in ran(owner)]
    finally:
        owner.execute("drop function public.weak()")


def test_a_project_of_1_1_0_had_the_door_open_and_its_update_closes_it(
    history: Path, tmp_path: Path
) -> None:
    """Released with search_path = '', a project created at 1.1.0 ran the inserting role's code
    as its owner through the enqueuing trigger; `copier update` and the push of 1.2.0's step
    close that door in the same database."""
    released = dict(zip(RELEASES, release_refs(), strict=True))["1.1.0"]
    project = render_repo(history, tmp_path / "app", "generated at 1.1.0", vcs_ref=released)
    cluster = start_supabase_like_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(user="postgres", autocommit=True) as owner:
            owner.execute(APP_TRIGGER)
            owner.execute(SHADOW_LOG)
            owner.execute(
                "create role mallory login; grant usage on schema public to mallory;"
                " grant insert on public.orders to mallory"
            )
            code = queue_code(owner)
            types, relations = shadowable_types(owner, code), shadowable_relations(owner, code)

            def insert_order(order: int) -> list[tuple]:
                owner.execute("truncate public.shadow_log")
                with cluster.connect(user="mallory", autocommit=True) as mallory:
                    plant(mallory, types, relations)
                    mallory.execute(
                        "insert into public.orders values (%s, 'a@example.com')", (order,)
                    )
                return ran(owner)

            assert ("postgres", True, "type text") in insert_order(1)
            update(project, "HEAD")
            supabase(project, "migration", "up", "--db-url", cluster.url())
            assert insert_order(2) == []
    finally:
        cluster.destroy()
