"""Who can redirect a wake-up or read its secret (issue 38, findings 1, 2 and 8; issue 47,
finding 2), each probe run against the real pg_net and Vault: a role that may only INSERT into
a table whose trigger enqueues, SETting the wake-up settings in its own session; `anon` reading
pg_net's queue while a wake-up waits in it, and rewriting its URL, its body or planting one of
its own there (hosted Supabase leaves pg_net's queue to PUBLIC); a Supabase API key or a secret
that is not base64 given as the wake-up secret; and configure() given a metadata-service URL,
credentials in a URL or an extension's setting as the secret's."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb
from standardwebhooks import WebhookVerificationError

from testkit.cluster import Cluster
from testkit.hosted import start_hosted_cluster
from testkit.postgrest import make_jwt
from testkit.project import (
    push_migrations,
    release_refs,
    render,
    render_repo,
)
from testkit.project import update as copier_update
from testkit.stack import point_wake_ups, start_supabase_like_cluster, wait_for_pg_net
from tests.support.http_sink import HttpSink, Request
from tests.support.wake_signing import secret_for, verified

SECRET = secret_for("wake-secret-for-tests-not-a-real-one")


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def attacker() -> Iterator[HttpSink]:
    """A server of the probing role's own."""
    with HttpSink() as server:
        yield server


@pytest.fixture
def order_writer(db: psycopg.Connection) -> Iterator[str]:
    """A role whose only right is INSERT on public.orders, whose trigger (the app's,
    SECURITY DEFINER, owned by postgres) enqueues a job for each new order."""
    db.execute(
        """
        create role order_writer login;
        create table public.orders (id bigint primary key);
        create function public.orders_enqueue() returns trigger
        language plpgsql security definer set search_path = '' as $$
        begin
          perform pgqueue.enqueue('order.placed', jsonb_build_object('order', new.id));
          return null;
        end;
        $$;
        create trigger orders_enqueue after insert on public.orders
          for each row execute function public.orders_enqueue();
        grant usage on schema public to order_writer;
        grant insert on public.orders to order_writer;
        """
    )
    yield "order_writer"
    db.execute(
        "drop table public.orders; drop function public.orders_enqueue();"
        " drop owned by order_writer; drop role order_writer"
    )


def insert_order_redirected(stack: Cluster, url: str, secret: str | None) -> None:
    """Logged in as order_writer: SET the queue's URL (and secret) settings in the session to the
    role's own, then insert an order."""
    with psycopg.connect(stack.dsn(user="order_writer")) as conn:
        url_setting, secret_setting = ("app.pgqueue_worker_url", "app.pgqueue_wake_secret")
        conn.execute("select set_config(%s, %s, false)", (url_setting, url))
        if secret is not None:
            conn.execute("select set_config(%s, %s, false)", (secret_setting, secret))
        conn.execute("insert into public.orders values (1)")
        conn.commit()


def test_a_role_that_may_only_insert_cannot_redirect_a_wake_up_set_on_the_database(
    db: psycopg.Connection, stack: Cluster, order_writer: str, sink: HttpSink, attacker: HttpSink
) -> None:
    point_wake_ups(db, sink.url, SECRET)
    insert_order_redirected(stack, attacker.url, None)
    wait_for_pg_net(db)
    assert attacker.requests == []
    assert [verified(r, SECRET)["reason"] for r in sink.requests] == ["enqueue"]


def test_a_role_that_may_only_insert_cannot_redirect_a_wake_up_set_in_vault(
    db: psycopg.Connection, stack: Cluster, order_writer: str, sink: HttpSink, attacker: HttpSink
) -> None:
    db.execute("select vault.create_secret(%s, 'pgqueue_worker_url')", (sink.url,))
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (SECRET,))
    # the secret a project upgraded from 0.1.0 may still have: never read since 1.0.0
    db.execute("select vault.create_secret(%s, 'pgqueue_service_key')", (make_jwt("service_role"),))
    insert_order_redirected(stack, attacker.url, None)
    wait_for_pg_net(db)
    assert attacker.requests == []
    assert [verified(r, SECRET)["reason"] for r in sink.requests] == ["enqueue"]


def test_a_role_level_setting_does_not_redirect_a_wake_up_either(
    db: psycopg.Connection, stack: Cluster, order_writer: str, sink: HttpSink, attacker: HttpSink
) -> None:
    """`alter role ... set` applies to that role's sessions only: the queue reads the
    database's own setting (setrole = 0)."""
    point_wake_ups(db, sink.url, SECRET)
    db.execute(
        sql.SQL("alter role order_writer set app.pgqueue_worker_url = {}").format(attacker.url)
    )
    with psycopg.connect(stack.dsn(user="order_writer")) as conn:
        conn.execute("insert into public.orders values (1)")
        conn.commit()
    wait_for_pg_net(db)
    assert attacker.requests == []
    assert len(sink.requests) == 1


def pending_wake_up_as(stack: Cluster, role: str) -> Request:
    """A wake-up as `role` reads it in pg_net's queue while it waits there (for certain in the
    enqueuing transaction, rolled back: nothing is sent)."""
    with stack.connect() as conn:
        conn.execute("select pgqueue.enqueue('probe')")
        conn.execute(f"set local role {role}")
        (url, headers, body) = conn.execute(
            "select url, headers, body from net.http_request_queue"
        ).fetchone()
        conn.rollback()
    return Request("POST", url, headers, body)


def assert_hosted_pg_net(db: psycopg.Connection) -> None:
    (owner,) = db.execute(
        "select pg_get_userbyid(relowner) from pg_class"
        " where oid = 'net.http_request_queue'::regclass"
    ).fetchone()
    assert owner == "supabase_admin", "the stack is shaped like hosted Supabase"


@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_where_pg_net_keeps_its_grants_a_pending_wake_up_holds_no_secret_and_a_valid_signature(
    db: psycopg.Connection, stack: Cluster, role: str
) -> None:
    """On hosted Supabase pg_net belongs to supabase_admin, so the queue's migration (run as
    postgres) cannot take back what pg_net grants PUBLIC: a request waiting in
    net.http_request_queue is readable by the API roles. It shows no secret: only the
    signature of its own id, time and body (Standard Webhooks), which the worker's library
    verifies with the secret."""
    assert_hosted_pg_net(db)
    point_wake_ups(db, "http://127.0.0.1:9/wake", SECRET)
    pending = pending_wake_up_as(stack, role)
    assert "Authorization" not in pending.headers
    assert SECRET not in str(pending.headers) and SECRET.encode() not in pending.body
    assert set(pending.headers) == {
        "Content-Type",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
    assert verified(pending, SECRET) == {"reason": "enqueue", "queues": ["default"]}
    with pytest.raises(WebhookVerificationError):
        verified(pending, secret_for("another-secret"))


def test_a_secret_made_with_openssl_rand_hex_signs_wake_ups_as_the_libraries_read_it(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """A wake-up secret made as the README said before 1.2.0 (`openssl rand -hex 32`) is base64
    as it is: the database, Python's library and npm's (test_edge_worker.py) key the HMAC with
    its base64 decoding, as Standard Webhooks reads a secret, with or without `whsec_`."""
    hex_secret = secrets.token_hex(32)
    for secret in (hex_secret, f"whsec_{hex_secret}"):
        point_wake_ups(db, "http://127.0.0.1:9/wake", secret)
        assert verified(pending_wake_up_as(stack, "postgres"), hex_secret)["reason"] == "enqueue"


def test_self_hosted_with_pgcrypto_in_a_schema_of_its_own_wake_ups_are_signed_all_the_same(
    project: Path, sink: HttpSink
) -> None:
    """Self-hosted, pgcrypto created before the queue in another schema than `extensions`: the
    migration leaves it there, and wake() signs with its hmac() there."""
    cluster = start_supabase_like_cluster()
    try:
        with cluster.connect(autocommit=True) as conn:
            conn.execute("create schema crypto; create extension pgcrypto with schema crypto")
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as conn:
            (where,) = conn.execute(
                "select extnamespace::regnamespace::text from pg_extension"
                " where extname = 'pgcrypto'"
            ).fetchone()
            point_wake_ups(conn, sink.url, SECRET)
            conn.execute("select pgqueue.enqueue('probe')")
            wait_for_pg_net(conn)
    finally:
        cluster.destroy()
    assert where == "crypto"
    assert [verified(r, SECRET)["reason"] for r in sink.requests] == ["enqueue"]


def test_the_step_from_1_1_0_warns_when_the_secret_is_not_base64(
    template: Path, tmp_path: Path
) -> None:
    """A secret of 1.1.0 that is not base64 worked as a bearer token, and signs nothing: the
    step says so as it applies, and where to read what to do."""
    project = render(template, tmp_path / "app", queue_baseline="1.1.0")
    step = project / "supabase/migrations/20261208000000_pgqueue_1_2_0_security.sql"
    step_sql = step.read_text()
    step.unlink()  # applied below, as `postgres`, where its warnings can be read
    for later in step.parent.glob("*.sql"):  # later releases' steps need it first
        if later.name > step.name:
            later.unlink()
    cluster = start_supabase_like_cluster()
    warnings: list[str] = []
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as conn:
            point_wake_ups(conn, "http://127.0.0.1:9/wake", "a-1.1.0-secret-that-is-not-base64")
        with psycopg.connect(cluster.dsn(user="postgres")) as conn:
            conn.add_notice_handler(
                lambda d: warnings.append(f"{d.message_primary} ({d.message_hint})")
            )
            conn.execute(step_sql)
    finally:
        cluster.destroy()
    (warning,) = [w for w in warnings if "from now on no wake-up is sent" in w]
    assert "is not base64" in warning and "openssl rand -hex 32" in warning, warning
    assert "upgrading.md#from-110-to-120" in warning


def refused_enqueue(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, secret: str
) -> list[str]:
    """With `secret` as the wake-up secret, an enqueue that sends no wake-up: its notices."""
    point_wake_ups(db, sink.url, secret)
    notices: list[str] = []
    with stack.connect(autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("select pgqueue.enqueue('probe')")
    wait_for_pg_net(db)
    assert sink.requests == []
    return notices


@pytest.mark.parametrize(
    "secret", ["wake-secret-for-tests-not-a-real-one", "0123456789abcdefa", "whsec_"]
)
def test_a_secret_that_is_not_base64_is_never_used_and_health_says_what_to_do(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, secret: str
) -> None:
    notices = refused_enqueue(db, stack, sink, secret)
    assert any("wake-up not sent" in n and "is not base64" in n for n in notices), notices
    assert not any(secret in n for n in notices if secret != "whsec_")
    ok, detail = {c: (o, d) for c, o, d in db.execute("select * from pgqueue.health()")}[
        "wake_secret"
    ]
    assert not ok and "openssl rand -hex 32" in detail, detail


def test_a_role_that_rewrites_pending_wake_ups_gets_no_secret_and_nothing_the_worker_takes(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, attacker: HttpSink
) -> None:
    """Hosted Supabase leaves pg_net's queue to PUBLIC: `anon` rewrites the URL of a waiting
    wake-up to its own server, and the body of another. The wake-up it gets holds no secret;
    the rewritten body no longer matches its signature, so the worker's library refuses it.
    (The redirected wake-up is lost to the worker: the sweeper's re-wake, within a minute, and
    the idle poll make up for it, docs/security.md.)"""
    assert_hosted_pg_net(db)
    point_wake_ups(db, sink.url, SECRET)
    with stack.connect() as conn:
        conn.execute("select pgqueue.enqueue('probe')")
        conn.execute("select pgqueue.enqueue('probe', queue => 'other')")
        conn.execute("set local role anon")
        redirected = conn.execute(
            "update net.http_request_queue set url = %s"
            " where convert_from(body, 'UTF8')::jsonb -> 'queues' ? 'default'",
            (attacker.url,),
        ).rowcount
        rewritten = conn.execute(
            "update net.http_request_queue set body = convert_to(replace("
            "convert_from(body, 'UTF8'), 'other', 'default'), 'UTF8') where url = %s",
            (sink.url,),
        ).rowcount
        conn.commit()
    wait_for_pg_net(db)
    assert (redirected, rewritten) == (1, 1)
    (stolen,) = attacker.requests
    assert "Authorization" not in stolen.headers and SECRET not in str(stolen.headers)
    (changed,) = sink.requests
    assert changed.json()["queues"] == ["default"]
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        verified(changed, SECRET)


def test_a_wake_up_planted_in_pg_nets_queue_does_not_stand_in_for_the_databases(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink
) -> None:
    """wake() sends no second wake-up while one of its own waits; one that `anon` wrote into
    pg_net's queue, to the same URL for the same queues with a made-up signature, is not its
    own: wake() sends its wake-up all the same."""
    point_wake_ups(db, sink.url, SECRET)
    with stack.connect() as conn:
        conn.execute("set local role anon")
        conn.execute(
            "insert into net.http_request_queue (method, url, headers, body, timeout_milliseconds)"
            " values ('POST', %s, jsonb_build_object('webhook-id', 'wake_planted',"
            " 'webhook-timestamp', extract(epoch from now())::bigint::text,"
            " 'webhook-signature', 'v1,bm90IGEgc2lnbmF0dXJl'),"
            ' convert_to(\'{"reason": "enqueue", "queues": ["default"]}\', \'UTF8\'), 2000)'
            " returning id",
            (sink.url,),
        )
        conn.execute("reset role")
        (planted,) = conn.execute("select max(id) from net.http_request_queue").fetchone()
        (sent,) = conn.execute("select pgqueue._wake('enqueue')").fetchone()
        (again,) = conn.execute("select pgqueue._wake('enqueue')").fetchone()
        conn.rollback()
    assert sent is not None and sent != planted
    assert again == sent, "its own waiting wake-up it does find"


@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_where_the_migration_owns_pg_net_a_pending_wake_up_is_not_readable_by_api_roles(
    project: Path, role: str
) -> None:
    """Self-hosted, where the role that migrates created pg_net: the migration revokes what
    pg_net grants PUBLIC on its request queue and responses."""
    cluster = start_supabase_like_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect() as conn:
            point_wake_ups(conn, "http://127.0.0.1:9/wake", SECRET)
            conn.commit()
        with cluster.connect() as conn:
            conn.execute("select pgqueue.enqueue('probe')")
            assert conn.execute("select count(*) from net.http_request_queue").fetchone() == (1,)
            conn.execute(f"set local role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select headers ->> 'Authorization' from net.http_request_queue")
            conn.rollback()
            conn.execute(f"set role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("select count(*) from net._http_response")
    finally:
        cluster.destroy()


@pytest.mark.parametrize(
    "api_key",
    [make_jwt("service_role"), make_jwt("anon"), "sb_secret_0123456789abcdefghijklmnop"],
    ids=["service_role-jwt", "anon-jwt", "sb_secret"],
)
def test_a_supabase_api_key_is_never_sent_as_the_wake_up_secret(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, api_key: str
) -> None:
    """The secret wake-ups are signed with must be one that only wakes the worker, never a
    key that opens the Data API."""
    notices = refused_enqueue(db, stack, sink, api_key)
    assert any("wake-up not sent" in n and "is a Supabase API key" in n for n in notices), notices
    assert not any(api_key in n for n in notices)
    ok, detail = dict(
        (c, (o, d)) for c, o, d in db.execute("select * from pgqueue.health()").fetchall()
    )["wake_secret"]
    assert not ok and "is a Supabase API key" in detail and api_key not in detail


REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.170.2/v2/credentials",
    "http://[fe80::1]/wake",
    "http://[::ffff:169.254.169.254]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://100.100.100.200/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://2852039166/",
    "http://0xa9fea9fe/",
    "http://0251.0376.0251.0376/",
    "http://user:hunter2@worker.example.com/wake",
    "https://token@worker.example.com/wake",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_configure_refuses_metadata_services_and_credentials_in_the_worker_url(
    db: psycopg.Connection, config: dict, url: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        db.execute("select pgqueue.configure(%s)", (Jsonb({"worker_url": url}),))
    assert refused.value.diag.message_hint and "link-local" in refused.value.diag.message_hint
    assert "hunter2" not in str(refused.value)
    with pytest.raises(psycopg.errors.CheckViolation, match="worker_url_is_allowed"):
        db.execute("update pgqueue.config set worker_url = %s", (url,))
    assert db.execute("select pgqueue.configure()").fetchone()[0] == config


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8000/wake",
        "http://127.0.0.1:8000/wake",
        "http://host.docker.internal:54321/functions/v1/job-worker",
        "http://10.0.0.7:8080/wake",
        "https://worker-abc123-uc.a.run.app/wake",
        "https://[2001:db8::1]/wake",
    ],
)
def test_configure_takes_local_and_public_worker_urls(
    db: psycopg.Connection, config: dict, url: str
) -> None:
    (result,) = db.execute("select pgqueue.configure(%s)", (Jsonb({"worker_url": url}),)).fetchone()
    assert result["worker_url"] == url


@pytest.mark.parametrize(
    "name",
    [
        "vault.getkey_script",
        "cron.database_name",
        "pg_net.batch_size",
        "plpgsql.extra_errors",
        "supautils.reserved_roles",
        "pgsodium.getkey_script",
        "request.jwt",
        "pgrst.db_schemas",
    ],
)
@pytest.mark.parametrize("setting", ["worker_url_setting", "service_key_setting"])
def test_configure_refuses_an_extensions_setting_for_the_url_or_the_secret(
    db: psycopg.Connection, config: dict, setting: str, name: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="belongs to") as refused:
        db.execute("select pgqueue.configure(%s)", (Jsonb({setting: name}),))
    assert "app.pgqueue_wake_secret" in (refused.value.diag.message_hint or "")
    assert db.execute("select pgqueue.configure()").fetchone()[0] == config


def test_a_loaded_extensions_prefix_is_refused_even_if_not_listed(
    db: psycopg.Connection, config: dict
) -> None:
    """pg_prewarm, loaded for this session only, puts its prefix in pg_settings, so
    configure() refuses it although the table's check (a fixed list) does not know it; a
    session's own custom setting does not count as an extension's."""
    db.execute("load 'pg_prewarm'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="belongs to a loaded"):
        db.execute(
            "select pgqueue.configure(%s)", (Jsonb({"service_key_setting": "pg_prewarm.x"}),)
        )
    db.execute("set app.pgqueue_worker_url = 'http://127.0.0.1:9/'")
    (result,) = db.execute(
        "select pgqueue.configure(%s)", (Jsonb({"service_key_setting": "app.other_secret"}),)
    ).fetchone()
    assert result["service_key_setting"] == "app.other_secret"


def test_a_refused_url_from_vault_or_a_setting_is_not_used_nor_shown(
    db: psycopg.Connection, stack: Cluster
) -> None:
    """Only configure() checks what it is given; the database setting and Vault are checked
    where they are read: nothing is sent, and health() says why without the credentials."""
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (SECRET,))
    for source in ("vault", "setting"):
        if source == "vault":
            db.execute(
                "select vault.create_secret('http://169.254.169.254/latest/', 'pgqueue_worker_url')"
            )
        else:
            point_wake_ups(db, "http://user:hunter2@127.0.0.1:9/wake", None)
        db.execute("select pgqueue.enqueue('probe')")
        wait_for_pg_net(db)
        assert db.execute("select count(*) from net._http_response").fetchone() == (0,)
        rows = {c: (o, d) for c, o, d in db.execute("select * from pgqueue.health()").fetchall()}
        ok, detail = rows["worker_url"]
        assert not ok and "no wake-up is sent" in detail, detail
        assert "hunter2" not in str(rows)


def test_a_project_from_0_1_0_wakes_its_worker_again_after_the_documented_steps(
    history: Path, tmp_path: Path
) -> None:
    """A hosted-shaped project created at 0.1.0 (python-http worker) whose wake-ups carry the
    service key from the Vault secret <schema>_service_key, as 0.1.0's README had it: after
    `copier update` and `supabase db push`, the key is no longer sent (nothing is, and
    health() says why); once the user follows docs/upgrading.md (a secret of its own in the
    Vault secret <schema>_wake_secret, the old one deleted), wake-ups arrive again at the same
    URL, signed with the new secret."""
    service_key = make_jwt("service_role")
    project = render_repo(
        history,
        tmp_path / "app",
        "generated at 0.1.0",
        vcs_ref=release_refs()[0],
        worker_style="python-http",
        claim_transport="postgres",
    )
    cluster = start_hosted_cluster()
    try:
        with HttpSink() as sink:
            with cluster.connect(autocommit=True) as admin:
                # 0.1.0 expects pg_net enabled from the dashboard, which creates it so
                admin.execute("create extension if not exists pg_net with schema extensions")
            push_migrations(project, cluster.url())
            with cluster.connect(autocommit=True) as db:
                db.execute("select vault.create_secret(%s, 'pgqueue_worker_url')", (sink.url,))
                db.execute("select vault.create_secret(%s, 'pgqueue_service_key')", (service_key,))

                def enqueue_and_wait() -> list[Request]:
                    before = len(sink.requests)
                    db.execute("select pgqueue.enqueue('send_email', '{}')")
                    wait_for_pg_net(db)
                    return sink.requests[before:]

                (sent,) = enqueue_and_wait()
                assert sent.headers["Authorization"] == f"Bearer {service_key}", "0.1.0 sends it"
                copier_update(project, "HEAD")
                push_migrations(project, cluster.url())
                assert enqueue_and_wait() == [], "1.0.0 never sends an API key"
                (why,) = db.execute(
                    "select detail from pgqueue.health() where component = 'wake_secret'"
                ).fetchone()
                assert service_key not in why
                # docs/upgrading.md, "From 0.1.0 to 1.0.0": a secret of its own, the key gone
                db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (SECRET,))
                db.execute("delete from vault.secrets where name = 'pgqueue_service_key'")
                (signed,) = enqueue_and_wait()
                assert verified(signed, SECRET)["reason"] == "enqueue"
                assert "Authorization" not in signed.headers
    finally:
        cluster.destroy()
