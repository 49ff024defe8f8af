"""Wake-ups: the statement-level trigger, pg_net (stand-in) over real HTTP, GUC and Vault keys,
and NOTIFY for listening workers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.support.cluster import Cluster
from tests.support.http_sink import HttpSink
from tests.support.pg_net import PgNetWorker
from tests.support.stack import point_wake_ups

GUC_KEY = "guc-test-key-not-a-real-secret"
VAULT_KEY = "vault-test-key-not-a-real-secret"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def vault_sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def insert_jobs(conn: psycopg.Connection, n: int) -> None:
    conn.execute(
        "insert into pgqueue.jobs (kind, payload)"
        " select 'bulk.job', jsonb_build_object('n', i) from generate_series(1, %s) as i",
        (n,),
    )


def requests_queued(db: psycopg.Connection) -> int:
    return db.execute("select count(*) from net.http_request_queue").fetchone()[0]


def test_one_insert_of_a_thousand_jobs_sends_one_request_with_the_guc_key(
    db: psycopg.Connection, sink: HttpSink, pg_net: PgNetWorker
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    insert_jobs(db, 1000)
    pg_net.wait_idle()

    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (1000,)
    assert len(sink.requests) == 1
    request = sink.requests[0]
    assert request.path == "/wake"
    assert request.headers["Authorization"] == f"Bearer {GUC_KEY}"
    assert request.json() == {"reason": "enqueue", "queues": ["default"]}
    assert db.execute("select status_code, timed_out from net._http_response").fetchall() == [
        (202, False)
    ]


def test_each_insert_statement_sends_its_own_wake_up(
    db: psycopg.Connection, sink: HttpSink, pg_net: PgNetWorker
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    for _ in range(3):
        db.execute("select pgqueue.enqueue('k')")
    db.execute('select pgqueue.enqueue_many(\'[{"kind": "a"}, {"kind": "b", "queue": "q2"}]\')')
    pg_net.wait_idle()
    assert len(sink.requests) == 4
    assert sorted(sink.requests[-1].json()["queues"]) == ["default", "q2"]


def test_delayed_jobs_and_duplicate_keys_send_no_wake_up(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    db.execute("select pgqueue.enqueue('later', run_after => now() + interval '1 hour')")
    assert requests_queued(db) == 0
    db.execute("select pgqueue.enqueue('k', idempotency_key => 'once')")
    db.execute("select pgqueue.enqueue('k', idempotency_key => 'once')")
    assert requests_queued(db) == 1


def test_without_a_key_nothing_is_sent_and_the_insert_commits(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, None)
    insert_jobs(db, 10)
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (10,)
    assert requests_queued(db) == 0


def test_without_pg_net_the_insert_still_commits(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink
) -> None:
    db.execute("alter schema net rename to net_uninstalled")
    try:
        with stack.connect() as conn:  # a separate transaction, committed below
            point_wake_ups(conn, sink.url, GUC_KEY)
            insert_jobs(conn, 5)
            conn.commit()
    finally:
        db.execute("alter schema net_uninstalled rename to net")
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (5,)
    assert requests_queued(db) == 0


def test_a_failing_pg_net_call_warns_and_the_insert_still_commits(
    db: psycopg.Connection, stack: Cluster
) -> None:
    notices: list[str] = []
    with stack.connect() as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        point_wake_ups(conn, "http://127.0.0.1:9/wake", GUC_KEY)
        # make net.http_post raise inside the trigger (pg_net errors on e.g. a bad URL)
        conn.execute("alter table net.http_request_queue add constraint refuse check (url <> url)")
        insert_jobs(conn, 3)
        conn.execute("alter table net.http_request_queue drop constraint refuse")
        conn.commit()
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (3,)
    assert any("wake-up not sent" in n and "23514" in n for n in notices), notices
    assert not any(GUC_KEY in n for n in notices)


def test_a_rolled_back_enqueue_leaves_no_job_and_sends_no_request(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, pg_net: PgNetWorker
) -> None:
    with stack.connect() as conn:
        point_wake_ups(conn, sink.url, GUC_KEY)
        conn.execute("create temporary table orders (id int)")
        conn.execute("insert into orders values (1)")
        conn.execute("select pgqueue.enqueue('order.placed', '{\"order\": 1}')")
        conn.rollback()
    pg_net.wait_idle()
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)
    assert requests_queued(db) == 0
    assert sink.requests == []


def test_listeners_are_notified_once_per_transaction_with_the_queue_name(
    db: psycopg.Connection, stack: Cluster
) -> None:
    with stack.connect(autocommit=True) as listener:
        listener.execute("listen pgqueue")
        with stack.connect() as conn:
            for _ in range(5):
                conn.execute("select pgqueue.enqueue('k')")
            conn.execute("select pgqueue.enqueue('k', queue => 'mail')")
            conn.commit()
        received = [n.payload for n in listener.notifies(timeout=1, stop_after=3)]
    assert sorted(received) == ["default", "mail"]


def create_vault_secrets(db: psycopg.Connection, url: str, key: str) -> None:
    db.execute("select vault.create_secret(%s, 'pgqueue_worker_url')", (url,))
    db.execute("select vault.create_secret(%s, 'pgqueue_service_key')", (key,))


def test_vault_secrets_alone_route_the_wake_up(
    db: psycopg.Connection, vault_sink: HttpSink, pg_net: PgNetWorker
) -> None:
    create_vault_secrets(db, vault_sink.url, VAULT_KEY)
    point_wake_ups(db, None, None)
    insert_jobs(db, 50)
    pg_net.wait_idle()
    assert len(vault_sink.requests) == 1
    assert vault_sink.requests[0].headers["Authorization"] == f"Bearer {VAULT_KEY}"


def test_the_guc_wins_over_vault(
    db: psycopg.Connection, sink: HttpSink, vault_sink: HttpSink, pg_net: PgNetWorker
) -> None:
    create_vault_secrets(db, vault_sink.url, VAULT_KEY)
    point_wake_ups(db, sink.url, GUC_KEY)
    insert_jobs(db, 5)
    pg_net.wait_idle()
    assert vault_sink.requests == []
    assert [r.headers["Authorization"] for r in sink.requests] == [f"Bearer {GUC_KEY}"]


def test_a_vault_key_with_the_guc_url(
    db: psycopg.Connection, sink: HttpSink, pg_net: PgNetWorker
) -> None:
    db.execute("select vault.create_secret(%s, 'pgqueue_service_key')", (VAULT_KEY,))
    point_wake_ups(db, sink.url, None)
    insert_jobs(db, 1)
    pg_net.wait_idle()
    assert [r.headers["Authorization"] for r in sink.requests] == [f"Bearer {VAULT_KEY}"]


def test_without_vault_or_guc_nothing_is_sent(db: psycopg.Connection) -> None:
    point_wake_ups(db, None, None)
    insert_jobs(db, 3)
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (3,)
    assert requests_queued(db) == 0


def test_without_a_vault_schema_the_lookup_is_skipped(
    db: psycopg.Connection, stack: Cluster
) -> None:
    db.execute("alter schema vault rename to vault_uninstalled")
    try:
        with stack.connect() as conn:
            point_wake_ups(conn, "http://127.0.0.1:9/wake", None)
            insert_jobs(conn, 2)
            conn.commit()
    finally:
        db.execute("alter schema vault_uninstalled rename to vault")
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (2,)
    assert requests_queued(db) == 0


@pytest.mark.parametrize("role", ["anon", "authenticated", "service_role"])
def test_no_api_role_can_read_the_secrets_through_the_queue(
    db: psycopg.Connection, role: str
) -> None:
    create_vault_secrets(db, "http://127.0.0.1:9/wake", VAULT_KEY)
    for call in (
        "select pgqueue.wake('probe')",
        "select pgqueue.notify_workers(array['default'], 'probe')",
    ):
        with db.transaction(force_rollback=True):
            db.execute(f"set local role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(call)
    if role != "service_role":
        with db.transaction(force_rollback=True):
            db.execute(f"set local role {role}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute("select decrypted_secret from vault.decrypted_secrets")


def test_the_sweeper_re_wakes_workers_while_runnable_jobs_wait(
    db: psycopg.Connection, sink: HttpSink, pg_net: PgNetWorker
) -> None:
    db.execute("select pgqueue.enqueue('late', run_after => now() + interval '50 milliseconds')")
    point_wake_ups(db, sink.url, GUC_KEY)
    assert db.execute("select woke from pgqueue.sweep()").fetchone() == (False,)
    time.sleep(0.1)
    assert db.execute("select woke from pgqueue.sweep()").fetchone() == (True,)
    pg_net.wait_idle()
    assert [r.json()["reason"] for r in sink.requests] == ["sweep"]


def test_the_sweeper_is_scheduled_with_pg_cron(db: psycopg.Connection) -> None:
    assert db.execute(
        "select schedule, command, database, username from cron.job where jobname = 'pgqueue-sweep'"
    ).fetchone() == ("* * * * *", "select pgqueue.sweep()", "postgres", "postgres")
