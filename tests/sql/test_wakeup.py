"""Wake-ups: the statement-level trigger, the real pg_net posting to real HTTP servers (a
recording sink, and a python-http worker of a rendered project), secrets from the database
setting and from real Vault secrets, and NOTIFY for listening workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from testkit.cluster import Cluster
from testkit.project import render, variant
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.http_sink import HttpSink
from tests.support.jobs import enqueue, job, wait_until
from tests.support.wake_signing import secret_for, verified
from tests.support.workers import Installed, Workers

# As Standard Webhooks writes a secret (whsec_ and base64), and as `openssl rand -hex 32` makes
# one (hex digits are base64 too): wake-ups are signed with either.
GUC_KEY = secret_for("guc-test-key-not-a-real-secret")
VAULT_KEY = "5ea1ed0f" * 8
WORKER_KEY = secret_for("worker-test-key-not-a-real-secret")


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def vault_sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture(scope="module")
def http_project(template: Path, interpreter: Path, tmp_path_factory) -> Installed:
    """A python-http project (postgres transport) rendered with the defaults; its worker runs
    from its src/ on pytest's interpreter."""
    http = variant("python-http", "postgres")
    path = render(template, tmp_path_factory.mktemp("http") / "project", **http.answers)
    return Installed(http, path, interpreter, path / "src")


@pytest.fixture
def http_workers(
    http_project: Installed, stack: Cluster, project: Path, tmp_path: Path
) -> Iterator[Workers]:
    """python-http workers against the stack, with WORKER_KEY as their wake-up secret, logging
    everything (DEBUG), with no idle poll and no linger: only a wake-up brings one in."""
    env = {
        "DB_URL": stack.dsn(user="postgres"),
        "SERVICE_ROLE_KEY": "service-key-of-no-use-to-wake-ups",
        "WAKE_SECRET": WORKER_KEY,
        "WORKER_POLL_INTERVAL": "3600",
        "WORKER_LINGER_SECONDS": "0",
        "LOG_LEVEL": "DEBUG",
    }
    workers = Workers(http_project, env, tmp_path)
    yield workers
    workers.kill_all()


def email(db: psycopg.Connection) -> int:
    return enqueue(db, "send_email", to="a@example.com", subject="Hi", text=".")


def responses(db: psycopg.Connection) -> list[int | None]:
    """The status of each wake-up pg_net sent, in order, once it has sent them all."""
    wait_for_pg_net(db)
    return [r[0] for r in db.execute("select status_code from net._http_response order by id")]


def insert_jobs(conn: psycopg.Connection, n: int) -> None:
    conn.execute(
        "insert into pgqueue.jobs (kind, payload)"
        " select 'bulk.job', jsonb_build_object('n', i) from generate_series(1, %s) as i",
        (n,),
    )


def requests_made(db: psycopg.Connection) -> int:
    """Requests pg_net was asked to send, counted once it has sent them all: it stores an
    outcome (a status, or the error) for every request it takes from its queue."""
    wait_for_pg_net(db)
    return db.execute("select count(*) from net._http_response").fetchone()[0]


def test_one_insert_of_a_thousand_jobs_sends_one_request_with_the_guc_key(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    insert_jobs(db, 1000)
    wait_for_pg_net(db)

    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (1000,)
    assert len(sink.requests) == 1
    request = sink.requests[0]
    assert request.path == "/wake"
    assert verified(request, GUC_KEY) == {"reason": "enqueue", "queues": ["default"]}
    assert "Authorization" not in request.headers
    assert db.execute("select status_code, timed_out from net._http_response").fetchall() == [
        (202, False)
    ]


def test_each_insert_statement_wakes_its_queues(db: psycopg.Connection, sink: HttpSink) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    for _ in range(3):
        db.execute("select pgqueue.enqueue('k')")
    db.execute('select pgqueue.enqueue_many(\'[{"kind": "a"}, {"kind": "b", "queue": "q2"}]\')')
    wait_for_pg_net(db)
    # One wake-up for each, unless one for the same queues still waited in pg_net's queue
    # (next test); pg_net sends its queued requests side by side, in any order.
    woken = sorted(sorted(r.json()["queues"]) for r in sink.requests)
    assert woken[-1] == ["default", "q2"]
    assert 2 <= len(woken) <= 4
    assert set(map(tuple, woken[:-1])) == {("default",)}


def test_a_burst_of_inserts_sends_one_wake_up_while_it_waits_in_pg_nets_queue(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    # pg_net sends only what was committed: in one transaction, every wake-up after the first
    # finds it still waiting.
    with db.transaction():
        ids = [db.execute("select pgqueue.enqueue('k')").fetchone()[0] for _ in range(30)]
        first = db.execute("select id from net.http_request_queue").fetchall()
        # Another queue is not covered by the waiting wake-up; a subset of it is.
        db.execute("select pgqueue.enqueue('k', queue => 'q2')")
        db.execute(
            """select pgqueue.enqueue_many('[{"kind": "a"}, {"kind": "b", "queue": "q2"}]')"""
        )
        db.execute("""select pgqueue.enqueue_many('[{"kind": "a", "queue": "q2"}]')""")
        waiting = db.execute("select count(*) from net.http_request_queue").fetchone()[0]
        returned = db.execute("select pgqueue._wake('test')").fetchone()[0]
    wait_for_pg_net(db)

    assert len(ids) == 30
    assert len(first) == 1, "30 inserts, one wake-up waiting"
    assert returned == first[0][0], "wake() returns the waiting wake-up's id"
    assert waiting == 3
    assert sorted(sorted(r.json()["queues"]) for r in sink.requests) == [
        ["default"],
        ["default", "q2"],
        ["q2"],
    ]


def test_a_backlog_in_pg_nets_queue_is_not_scanned_by_every_wake_up(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    """pg_net's table has no index on the URL: with 50,000 requests to another URL waiting (a
    database webhook's backlog), wake() looks at the table's last pages only, where a new
    request goes, so it reads a few thousand rows, not 50,000, and still finds its own."""
    point_wake_ups(db, sink.url, GUC_KEY)
    read = (
        "select coalesce(sum(seq_tup_read), 0) from pg_stat_xact_user_tables"
        " where relid = 'net.http_request_queue'::regclass"
    )
    # never committed: pg_net sends none of it
    with db.transaction(force_rollback=True):
        db.execute(
            "insert into net.http_request_queue (method, url, headers, body, timeout_milliseconds)"
            " select 'POST', 'http://webhook.invalid/hook', jsonb_build_object('Authorization',"
            " 'Bearer ' || md5(g::text)), convert_to(jsonb_build_object('row', g)::text, 'UTF8'),"
            " 2000 from generate_series(1, 50000) as g"
        )
        before = db.execute(read).fetchone()[0]
        first = db.execute("select pgqueue._wake('test')").fetchone()[0]
        again = db.execute("select pgqueue._wake('test')").fetchone()[0]
        scanned = db.execute(read).fetchone()[0] - before
    assert first is not None and again == first, "the waiting wake-up is found past the backlog"
    assert 0 < scanned < 2 * 5_000, f"two wake-ups read {scanned} rows of 50,000"


def test_one_insert_wakes_only_the_queues_with_due_jobs(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    later = "2999-01-01T00:00:00Z"
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (
            json.dumps(
                [
                    {"kind": "a", "queue": "q-later", "run_after": later},
                    {"kind": "b", "queue": "q-now"},
                    {"kind": "c", "queue": "q-later", "run_after": later},
                    {"kind": "d", "queue": "q-now-too"},
                ]
            ),
        ),
    )
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (json.dumps([{"kind": "e", "queue": "q-later", "run_after": later}] * 2),),
    )
    wait_for_pg_net(db)
    assert [sorted(r.json()["queues"]) for r in sink.requests] == [["q-now", "q-now-too"]]


def test_delayed_jobs_and_duplicate_keys_send_no_wake_up(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, GUC_KEY)
    db.execute("select pgqueue.enqueue('later', run_after => now() + interval '1 hour')")
    assert requests_made(db) == 0
    db.execute("select pgqueue.enqueue('k', idempotency_key => 'once')")
    db.execute("select pgqueue.enqueue('k', idempotency_key => 'once')")
    assert requests_made(db) == 1


def test_without_a_key_nothing_is_sent_and_the_insert_commits(
    db: psycopg.Connection, sink: HttpSink
) -> None:
    point_wake_ups(db, sink.url, None)
    insert_jobs(db, 10)
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (10,)
    assert requests_made(db) == 0


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
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (5,)
    assert requests_made(db) == 0


def test_a_failing_pg_net_call_warns_and_the_insert_still_commits(
    db: psycopg.Connection, stack: Cluster
) -> None:
    notices: list[str] = []
    with stack.connect() as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        # pg_net's http_post raises on a URL it cannot parse
        point_wake_ups(conn, "http://127.0.0.1:notaport/wake", GUC_KEY)
        insert_jobs(conn, 3)
        conn.commit()
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (3,)
    assert any("wake-up not sent" in n and "invalid URL" in n for n in notices), notices
    assert not any(GUC_KEY in n for n in notices)
    assert requests_made(db) == 0


def test_a_rolled_back_enqueue_leaves_no_job_and_sends_no_request(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink
) -> None:
    with stack.connect() as conn:
        point_wake_ups(conn, sink.url, GUC_KEY)
        conn.execute("create temporary table orders (id int)")
        conn.execute("insert into orders values (1)")
        conn.execute("select pgqueue.enqueue('order.placed', '{\"order\": 1}')")
        conn.rollback()
        # then one that commits: pg_net sends it, and it is the only request it ever sees
        point_wake_ups(conn, sink.url, GUC_KEY)  # the rollback undid the settings too
        conn.execute("select pgqueue.enqueue('after.rollback')")
        conn.commit()
    assert requests_made(db) == 1
    assert db.execute("select kind from pgqueue.all_jobs").fetchall() == [("after.rollback",)]
    assert len(sink.requests) == 1


def test_listeners_are_notified_once_per_transaction_with_the_queue_name(
    db: psycopg.Connection, stack: Cluster, config: dict
) -> None:
    db.execute("""select pgqueue.configure('{"notify_listeners": true}')""")
    with stack.connect(autocommit=True) as listener:
        listener.execute("listen pgqueue")
        with stack.connect() as conn:
            for _ in range(5):
                conn.execute("select pgqueue.enqueue('k')")
            conn.execute("select pgqueue.enqueue('k', queue => 'mail')")
            conn.commit()
        received = [n.payload for n in listener.notifies(timeout=1, stop_after=3)]
    assert sorted(received) == ["default", "mail"]


def test_with_notify_listeners_off_an_insert_sends_no_notify_but_its_wake_up(
    db: psycopg.Connection, stack: Cluster, sink: HttpSink, config: dict
) -> None:
    """Where no worker LISTENs (the supabase transport, Edge Functions), an enqueue sends no
    NOTIFY, whose commit PostgreSQL would serialize, and still its pg_net wake-up."""
    db.execute("""select pgqueue.configure('{"notify_listeners": false}')""")
    with stack.connect(autocommit=True) as listener:
        listener.execute("listen pgqueue")
        with stack.connect() as conn:
            point_wake_ups(conn, sink.url, GUC_KEY)
            conn.execute("select pgqueue.enqueue('k')")
            conn.commit()
        # the same, on again and with no URL, as a control: the listener hears this one
        point_wake_ups(db, None, None)
        db.execute("""select pgqueue.configure('{"notify_listeners": true}')""")
        db.execute("select pgqueue.enqueue('k', queue => 'mail')")
        received = [n.payload for n in listener.notifies(timeout=1, stop_after=2)]
    assert received == ["mail"]
    assert requests_made(db) == 1, "the wake-up of the first insert (the second has no URL)"
    assert len(sink.requests) == 1


def create_vault_secrets(db: psycopg.Connection, url: str, key: str) -> None:
    db.execute("select vault.create_secret(%s, 'pgqueue_worker_url')", (url,))
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (key,))


def test_vault_secrets_alone_route_the_wake_up(
    db: psycopg.Connection, vault_sink: HttpSink
) -> None:
    create_vault_secrets(db, vault_sink.url, VAULT_KEY)
    point_wake_ups(db, None, None)
    insert_jobs(db, 50)
    wait_for_pg_net(db)
    assert len(vault_sink.requests) == 1
    assert verified(vault_sink.requests[0], VAULT_KEY)["reason"] == "enqueue"


def test_the_guc_wins_over_vault(
    db: psycopg.Connection, sink: HttpSink, vault_sink: HttpSink
) -> None:
    create_vault_secrets(db, vault_sink.url, VAULT_KEY)
    point_wake_ups(db, sink.url, GUC_KEY)
    insert_jobs(db, 5)
    wait_for_pg_net(db)
    assert vault_sink.requests == []
    assert [verified(r, GUC_KEY)["reason"] for r in sink.requests] == ["enqueue"]


def test_a_vault_key_with_the_guc_url(db: psycopg.Connection, sink: HttpSink) -> None:
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (VAULT_KEY,))
    point_wake_ups(db, sink.url, None)
    insert_jobs(db, 1)
    wait_for_pg_net(db)
    assert [verified(r, VAULT_KEY)["reason"] for r in sink.requests] == ["enqueue"]


def test_without_vault_or_guc_nothing_is_sent(db: psycopg.Connection) -> None:
    point_wake_ups(db, None, None)
    insert_jobs(db, 3)
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (3,)
    assert requests_made(db) == 0


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
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (2,)
    assert requests_made(db) == 0


@pytest.mark.parametrize("role", ["anon", "authenticated", "service_role"])
def test_no_api_role_can_read_the_secrets_through_the_queue(
    db: psycopg.Connection, role: str
) -> None:
    create_vault_secrets(db, "http://127.0.0.1:9/wake", VAULT_KEY)
    for call in (
        "select pgqueue._wake('probe')",
        "select pgqueue._notify_workers(array['default'], 'probe')",
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
    db: psycopg.Connection, sink: HttpSink
) -> None:
    db.execute("select pgqueue.enqueue('late', run_after => now() + interval '50 milliseconds')")
    point_wake_ups(db, sink.url, GUC_KEY)
    assert db.execute("select woke from pgqueue.sweep()").fetchone() == (False,)
    time.sleep(0.1)
    assert db.execute("select woke from pgqueue.sweep()").fetchone() == (True,)
    wait_for_pg_net(db)
    assert [r.json()["reason"] for r in sink.requests] == ["sweep"]


def test_the_sweeper_is_scheduled_with_pg_cron(db: psycopg.Connection) -> None:
    assert db.execute(
        "select schedule, command, database, username from cron.job where jobname = 'pgqueue-sweep'"
    ).fetchone() == ("* * * * *", "select pgqueue.sweep()", "postgres", "postgres")


def test_a_wrong_key_gets_403_and_runs_nothing_then_the_vault_key_gets_in(
    db: psycopg.Connection, http_workers: Workers
) -> None:
    worker = http_workers.start()
    point_wake_ups(db, f"{worker.url}/wake", secret_for("a-stale-key"))
    stale = email(db)
    assert responses(db) == [403]
    time.sleep(0.5)
    assert (job(db, stale)["status"], job(db, stale)["attempts"]) == ("queued", 0)

    # No key setting, the worker's key in Vault: the next enqueue's wake-up gets in, and the
    # worker's drain runs the waiting job too.
    db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (WORKER_KEY,))
    point_wake_ups(db, f"{worker.url}/wake", None)
    fresh = email(db)
    wait_until(lambda: {job(db, i)["status"] for i in (stale, fresh)} == {"done"})
    assert responses(db) == [403, 202]
    assert worker.proc.poll() is None


def test_no_key_reaches_a_log(
    db: psycopg.Connection, stack: Cluster, http_workers: Workers, sink: HttpSink
) -> None:
    """Wake-ups that get in, are refused, cannot connect or cannot even be queued, with the
    key from the setting and from Vault: neither PostgreSQL's log (at every level down to
    debug1, with failing statements logged) nor the worker's (at DEBUG) shows a key. At
    debug2 and below pg_net has curl print every request, headers and all, to the server's
    log: see docs/security.md."""
    log_start = stack.logfile.stat().st_size
    db.execute("alter system set log_min_messages = 'debug1'")
    db.execute("alter system set log_min_error_statement = 'error'")
    db.execute("select pg_reload_conf()")
    try:
        worker = http_workers.start()
        wake = f"{worker.url}/wake"
        point_wake_ups(db, wake, WORKER_KEY)
        done = email(db)  # 202
        point_wake_ups(db, wake, GUC_KEY)
        email(db)  # 403: the worker's key is another one
        point_wake_ups(db, "http://127.0.0.1:9/wake", GUC_KEY)
        email(db)  # nothing listens there
        point_wake_ups(db, "http://127.0.0.1:notaport/wake", GUC_KEY)
        email(db)  # pg_net refuses the URL: the trigger's warning
        db.execute("select vault.create_secret(%s, 'pgqueue_wake_secret')", (VAULT_KEY,))
        point_wake_ups(db, wake, None)
        email(db)  # 403, with the Vault key
        point_wake_ups(db, sink.url, None)
        email(db)  # 202 from the sink, with the Vault key
        assert responses(db) == [202, 403, None, 403, 202]
        wait_until(lambda: job(db, done)["status"] == "done")
    finally:
        db.execute("alter system reset log_min_messages")
        db.execute("alter system reset log_min_error_statement")
        db.execute("select pg_reload_conf()")
    with stack.logfile.open("rb") as f:
        f.seek(log_start)
        server_log = f.read().decode(errors="replace")
    worker_log = worker.output()
    # the logs are there, and say what went wrong
    assert "wake-up not sent" in server_log and "invalid URL" in server_log
    assert "DEBUG" in server_log
    assert "job.done" in worker_log
    assert verified(sink.requests[0], VAULT_KEY)["reason"] == "enqueue"
    for key in (WORKER_KEY, GUC_KEY, VAULT_KEY):
        assert key not in server_log
        assert key not in worker_log
