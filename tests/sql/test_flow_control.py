"""Flow control and results in the SQL contract, on a real PostgreSQL: concurrency keys and
their limits, fairness between keys, pause and resume, rate limits, recurring jobs,
idempotency modes, results and progress."""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.cluster import Cluster
from tests.sql.test_hot_path import claimers_drain, complete_and_claim
from tests.sql.test_queue import AS_ROWS, enqueue_n
from tests.support.jobs import job, job_by_id, running_of_key

# -- concurrency keys -------------------------------------------------------------------


def test_no_more_than_a_keys_limit_run_at_once_across_concurrent_claimers(
    flow: psycopg.Connection, stack: Cluster
) -> None:
    db = flow
    assert db.execute("select pgqueue.set_concurrency_limit('tenant-a', 3)").fetchone() == (3,)
    keyed = enqueue_n(db, 240, concurrency_key="tenant-a")
    other = enqueue_n(db, 240)
    with running_of_key(stack, "tenant-a", every=0) as seen_running:
        completed = claimers_drain(stack, claimers=8, max_jobs=10, hold=0.005, wait_for_slots=True)
    assert sorted(completed) == sorted(keyed + other) and set(completed.values()) == {1}
    assert max(seen_running) <= 3, "the audit saw more running than the key's limit"
    assert max(seen_running) == 3, "and the limit was reached, so it was tested"
    assert len(seen_running) > 50


def test_one_insert_marks_each_queue_it_gives_keyed_jobs_and_their_claims_find_them(
    flow: psycopg.Connection,
) -> None:
    """The insert trigger marks the queues that receive keyed jobs (queues.keyed), so that
    their claims look for keyed jobs: one statement spanning queues marks each keyed one."""
    db = flow
    ids = [
        row[0]
        for row in db.execute(
            "select pgqueue.enqueue_many(%s)",
            (
                Jsonb(
                    [
                        {"kind": "k", "queue": "plain"},
                        {"kind": "k", "queue": "tenants", "concurrency_key": "t1"},
                        {"kind": "k", "queue": "plain"},
                        {"kind": "k", "queue": "regions", "concurrency_key": "r1"},
                    ]
                ),
            ),
        ).fetchall()
    ]
    marked = db.execute("select queue from pgqueue.queues where keyed order by queue").fetchall()
    assert marked == [("regions",), ("tenants",)]
    for queue, wanted in (("tenants", [ids[1]]), ("regions", [ids[3]]), ("plain", ids[::2])):
        claimed = complete_and_claim(db, max_jobs=10, queue=queue)
        assert sorted(j["id"] for j in claimed) == sorted(wanted), queue


def test_a_default_limit_applies_to_keys_without_their_own(flow: psycopg.Connection) -> None:
    db = flow
    db.execute("""select pgqueue.configure('{"default_concurrency_limit": 1}')""")
    db.execute("select pgqueue.set_concurrency_limit('roomy', 2)")
    enqueue_n(db, 5, concurrency_key="tight")
    enqueue_n(db, 5, concurrency_key="roomy")
    claimed = complete_and_claim(db, max_jobs=100)
    assert Counter(j["concurrency_key"] for j in claimed) == {"tight": 1, "roomy": 2}
    assert complete_and_claim(db, max_jobs=100) == [], "both keys are full"
    complete_and_claim(db, claimed[:1], max_jobs=0)
    (again,) = complete_and_claim(db, max_jobs=100)
    assert again["concurrency_key"] == claimed[0]["concurrency_key"], "a finished job frees a slot"
    assert db.execute("select pgqueue.set_concurrency_limit('roomy', null)").fetchone() == (1,)


def test_keys_take_turns_so_a_big_backlog_does_not_hold_small_keys_back(
    flow: psycopg.Connection,
) -> None:
    db = flow
    enqueue_n(db, 2_000, concurrency_key="big")
    small = [enqueue_n(db, 3, concurrency_key=f"small-{i}") for i in range(10)]
    claimed = [j["id"] for j in complete_and_claim(db, max_jobs=40)]
    assert all(i in claimed for ids in small for i in ids), "every small key's jobs start first"
    assert 10 <= sum(1 for i in claimed if i < small[0][0]) < 40, "and the big key gets turns"


def test_a_retried_dead_letter_keeps_its_key(flow: psycopg.Connection) -> None:
    db = flow
    (job_id,) = enqueue_n(db, 1, concurrency_key="k")
    (claimed,) = complete_and_claim(db)
    db.execute(
        "select pgqueue.fail(%s, %s, 'no', retryable => false)", (job_id, claimed["lock_token"])
    )
    assert job_by_id(db, job_id)["concurrency_key"] == "k"
    db.execute("select pgqueue.retry(%s)", (job_id,))
    assert job(db, job_id)["concurrency_key"] == "k"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("set_concurrency_limit('k', 0)", "max_running must be between 1 and 100000, got 0"),
        ("set_concurrency_limit(null, 1)", "set_concurrency_limit needs a concurrency key"),
        ("pause('')", "pause needs a queue name"),
        ("set_rate_limit('q', 0, 1)", "a rate limit needs per_second > 0 and burst >= 1"),
        ("set_rate_limit('q', 'NaN', 1)", "per_second must be more than 0 and at most 1000000"),
        ("enqueue('k', on_conflict => 'merge')", "on_conflict must be keep, replace or debounce"),
        # odd input (issue 38, finding 9): refused with what is wrong, never a cast's error
        ("set_rate_limit('q', 'NaN')", "per_second must be more than 0 and at most 1000000"),
        ("set_rate_limit('q', 'Infinity')", "per_second must be more than 0 and at most 1000000"),
        ("set_rate_limit('q', 1e30)", "per_second must be more than 0 and at most 1000000"),
        ("set_rate_limit(repeat('q', 201), 1)", "a queue name is 1 to 200 characters"),
        ("pause(repeat('q', 10000))", "a queue name is 1 to 200 characters"),
        ("schedule('s', '* * * * *', repeat('k', 300))", "a job kind is 1 to 200 characters"),
        (
            "schedule('s', '* * * * *', 'k', queue => repeat('q', 201))",
            "a queue name is 1 to 200 characters",
        ),
    ],
)
def test_bad_settings_are_refused(flow: psycopg.Connection, call: str, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        flow.execute(f"select pgqueue.{call}")


# -- pause, resume, rate limits -----------------------------------------------------------


def test_a_paused_queue_is_not_claimed_and_its_running_jobs_finish(
    flow: psycopg.Connection,
) -> None:
    db = flow
    first, second = enqueue_n(db, 2)
    (running,) = complete_and_claim(db, max_jobs=1)
    assert db.execute("select pgqueue.pause('default')").fetchone() == (True,)
    assert db.execute("select pgqueue.pause('default')").fetchone() == (False,)
    assert complete_and_claim(db, [running], max_jobs=10) == [], "nothing is claimed"
    assert job(db, first)["status"] == "done", "but the running job's completion counts"
    assert db.execute("select count(*) from pgqueue.claim('w', 10)").fetchone() == (0,)
    assert db.execute(
        "select bool_and(paused) from pgqueue.stats where queue = 'default'"
    ).fetchone() == (True,)
    assert db.execute(
        "select paused, queued from pgqueue.queue_states where queue = 'default'"
    ).fetchone() == (True, 1)
    # resume() wakes the workers: with a NOTIFY too where they LISTEN
    db.execute("""select pgqueue.configure('{"notify_listeners": true}')""")
    db.execute("listen pgqueue")
    assert db.execute("select pgqueue.resume('default')").fetchone() == (True,)
    assert [n.payload for n in db.notifies(timeout=2, stop_after=1)] == ["default"]
    assert [j["id"] for j in complete_and_claim(db)] == [second]
    assert db.execute("select pgqueue.resume('default')").fetchone() == (False,)
    assert db.execute("select count(*) from pgqueue.queues").fetchone() == (0,)


def test_a_rate_limit_lets_the_burst_through_then_the_rate(flow: psycopg.Connection) -> None:
    db = flow
    enqueue_n(db, 100, queue="rated")
    db.execute("select pgqueue.set_rate_limit('rated', 20, 5)")
    started = time.monotonic()
    assert len(complete_and_claim(db, max_jobs=100, queue="rated")) == 5, "the burst"
    assert len(complete_and_claim(db, max_jobs=100, queue="rated")) <= 1
    time.sleep(0.5)
    assert len(complete_and_claim(db, max_jobs=100, queue="rated")) == 5, "the bucket holds 5"
    claimed = 10
    while time.monotonic() - started < 1.5:
        time.sleep(0.05)
        claimed += len(complete_and_claim(db, max_jobs=100, queue="rated"))
    elapsed = time.monotonic() - started
    # (while it slept, the full bucket let the rest of the refill go)
    assert 10 + 20 * (elapsed - 0.5) - 3 <= claimed <= 5 + 20 * elapsed + 1, "then the rate"
    assert len(complete_and_claim(db, max_jobs=100)) == 0, "other queues are not limited"
    db.execute("select pgqueue.set_rate_limit('rated', null)")
    assert len(complete_and_claim(db, max_jobs=100, queue="rated")) > 50


def test_concurrent_claims_never_exceed_the_rate(flow: psycopg.Connection, stack: Cluster) -> None:
    db = flow
    enqueue_n(db, 2_000, queue="rated")
    rate, burst = 50, 10
    db.execute("select pgqueue.set_rate_limit('rated', %s, %s)", (rate, burst))
    claims: list[tuple[float, int]] = []
    lock = threading.Lock()
    began = time.monotonic()

    def claimer() -> None:
        with stack.connect(autocommit=True) as conn:
            while time.monotonic() - began < 2.0:
                n = len(complete_and_claim(conn, max_jobs=20, queue="rated"))
                with lock:
                    claims.append((time.monotonic(), n))

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    counted = sorted((at, n) for at, n in claims if n)
    assert sum(n for _, n in counted) > burst, "the claimers got past the burst"
    # every window [t_i, t_j] holds at most burst + rate * length jobs (plus one claim's
    # worth of clock slack between the database's clock and ours)
    for i, (start, _) in enumerate(counted):
        total = 0
        for end, n in counted[i:]:
            total += n
            assert total <= burst + rate * (end - start) + rate * 0.05 + 1


# -- recurring jobs ---------------------------------------------------------------------------


def test_a_schedule_enqueues_one_job_per_slot(flow: psycopg.Connection) -> None:
    """A five-field schedule runs from the per-minute pg_cron job (test_schedules.py moves its
    clock); enqueue_scheduled(name) enqueues the current slot's job, once."""
    db = flow
    (cron_id,) = db.execute(
        "select pgqueue.schedule('nightly-report', '0 3 * * *', 'report.nightly',"
        ' \'{"to": "ops"}\')'
    ).fetchone()
    assert db.execute(
        "select jobname, schedule, command from cron.job where jobid = %s", (cron_id,)
    ).fetchone() == ("pgqueue-schedules", "* * * * *", "select pgqueue._run_schedules()")
    first = db.execute("select pgqueue.enqueue_scheduled('nightly-report')").fetchone()[0]
    again = db.execute("select pgqueue.enqueue_scheduled('nightly-report')").fetchone()[0]
    assert first == again, "a repeated run of the same slot adds nothing"
    row = job(db, first)
    assert (row["kind"], row["payload"]) == ("report.nightly", {"to": "ops"})
    assert row["idempotency_key"].startswith("schedule:nightly-report:")
    listed = db.execute("select name, cron, kind, active from pgqueue.schedules").fetchall()
    assert listed == [("nightly-report", "0 3 * * *", "report.nightly", True)]
    db.execute("select pgqueue.schedule('nightly-report', '0 4 * * *', 'report.nightly')")
    assert db.execute("select cron from pgqueue.schedules").fetchall() == [("0 4 * * *",)], (
        "scheduling a name again changes it"
    )
    assert db.execute("select pgqueue.unschedule('nightly-report')").fetchone() == (True,)
    assert db.execute("select pgqueue.unschedule('nightly-report')").fetchone() == (False,)
    assert db.execute(
        "select count(*) from cron.job where jobname like 'pgqueue-schedule%'"
    ).fetchone() == (0,), "the per-minute job goes with the last schedule"
    assert job(db, first)["status"] == "queued", "its queued job stays"


def test_a_schedule_in_seconds_goes_to_pg_cron_and_one_of_its_own_moves_when_redefined(
    flow: psycopg.Connection,
) -> None:
    """'[1-59] seconds' schedules keep a pg_cron job of their own, which pg_cron before 1.5
    (this machine's) refuses; a schedule with a job of its own (in seconds, or one 1.3.0
    defined) moves to the per-minute job when redefined with five fields."""
    db = flow
    (version,) = db.execute(
        "select extversion from pg_extension where extname = 'pg_cron'"
    ).fetchone()
    assert version.startswith("1.4")
    with pytest.raises(psycopg.Error, match="invalid schedule: 30 seconds"):
        db.execute("select pgqueue.schedule('pulse', '30 seconds', 'pulse')")
    assert db.execute("select count(*) from pgqueue.schedules_defined").fetchone() == (0,)
    db.execute(
        "insert into pgqueue.schedules_defined (name, cron, kind)"
        " values ('pulse', '* * * * *', 'p');"
        "set role postgres;"  # as schedule() made it, in 1.3.0
        "select cron.schedule('pgqueue-schedule-pulse', '* * * * *',"
        " 'select pgqueue.enqueue_scheduled(''pulse'')');"
        "reset role"
    )
    (job_id,) = db.execute("select pgqueue.enqueue_scheduled('pulse')").fetchone()
    assert job(db, job_id)["idempotency_key"].endswith(":00Z"), "the second, as in 1.3.0"
    db.execute("select pgqueue.schedule('pulse', '*/2 * * * *', 'pulse')")
    assert db.execute(
        "select jobname from cron.job where jobname like 'pgqueue-schedule%'"
    ).fetchall() == [("pgqueue-schedules",)]


def test_a_bad_schedule_is_refused_with_its_reason(flow: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="a schedule name is"):
        flow.execute("select pgqueue.schedule('no spaces', '* * * * *', 'k')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="has five fields"):
        flow.execute("select pgqueue.schedule('bad', 'every day', 'k')")
    assert flow.execute("select count(*) from pgqueue.schedules").fetchone() == (0,)


# -- idempotency modes --------------------------------------------------------------------------


def test_replace_and_debounce_change_a_waiting_job_and_never_a_running_one(
    flow: psycopg.Connection,
) -> None:
    db = flow

    def enqueue(mode: str, payload: dict, delay: str) -> int:
        return db.execute(
            "select pgqueue.enqueue('sync', %s, now() + %s::interval, 'sync-1', on_conflict => %s)",
            (Jsonb(payload), delay, mode),
        ).fetchone()[0]

    job_id = enqueue("keep", {"v": 1}, "10 seconds")
    assert enqueue("keep", {"v": 2}, "1 hour") == job_id
    assert job(db, job_id)["payload"] == {"v": 1}
    assert enqueue("debounce", {"v": 3}, "1 minute") == job_id
    pushed = job(db, job_id)
    assert pushed["payload"] == {"v": 3} and 50 < pushed["due_in"].total_seconds() <= 60
    assert enqueue("debounce", {"v": 4}, "1 second") == job_id
    assert job(db, job_id)["due_in"].total_seconds() > 50, "debounce never brings it sooner"
    assert enqueue("replace", {"v": 5}, "0 seconds") == job_id
    replaced = job(db, job_id)
    assert replaced["payload"] == {"v": 5} and replaced["due_in"].total_seconds() <= 0
    (running,) = complete_and_claim(db)
    assert running["id"] == job_id
    assert enqueue("replace", {"v": 6}, "0 seconds") == job_id
    assert job(db, job_id)["payload"] == {"v": 5}, "a running job is left as it is"
    assert db.execute("select count(*) from pgqueue.live_jobs").fetchone() == (1,)


def test_a_key_outlives_the_retention_for_the_key_window(flow: psycopg.Connection) -> None:
    db = flow
    keyed = db.execute("select pgqueue.enqueue('k', idempotency_key => 'kept')").fetchone()[0]
    plain = db.execute("select pgqueue.enqueue('k')").fetchone()[0]
    batch = complete_and_claim(db)
    complete_and_claim(db, batch, max_jobs=0)
    db.execute("update pgqueue.job_history set finished_at = now() - interval '10 days'")
    db.execute("update pgqueue.done_batches set finished_at = now() - interval '10 days'")
    db.execute("""select pgqueue.configure('{"key_retention_days": 30}')""")
    assert db.execute("select pruned from pgqueue.sweep()").fetchone() == (1,)
    assert db.execute("select pgqueue.enqueue('k', idempotency_key => 'kept')").fetchone() == (
        keyed,
    ), "past the retention, the key is still taken"
    assert db.execute("select count(*) from pgqueue.job(%s)", (plain,)).fetchone() == (0,)
    db.execute("""select pgqueue.configure('{"key_retention_days": 5}')""")
    assert db.execute("select pruned from pgqueue.sweep()").fetchone() == (1,)


# -- results and progress ---------------------------------------------------------------------


def test_a_progress_report_writes_its_own_job_not_the_whole_claims(
    flow: psycopg.Connection,
) -> None:
    """A claim of 50 jobs, each with about 50 KB of progress reported: one small report more
    writes WAL for that job's report, not for all 2.5 MB of the claim's progress again (issue
    38, finding 4: 50 small reports wrote 76 MB). Each job still reads its own progress, the
    claim ends with it, and its reports go with it."""
    db = flow
    ids = enqueue_n(db, 50, **AS_ROWS)
    batch = complete_and_claim(db, max_jobs=50)
    token = batch[0]["lock_token"]
    big = Jsonb({"log": [f"line {i:06d} " + "x" * 40 for i in range(1000)]})
    for job_id in ids:
        db.execute("select pgqueue.progress(%s, %s, %s)", (job_id, token, big))
    db.execute("checkpoint")  # full-page images are written once after a checkpoint: not ours
    db.execute("select pgqueue.progress(%s, %s, %s)", (ids[0], token, Jsonb({"warm": 1})))
    (before,) = db.execute("select pg_current_wal_lsn()").fetchone()
    for n in range(10):
        db.execute("select pgqueue.progress(%s, %s, %s)", (ids[n], token, Jsonb({"done": n})))
    (written,) = db.execute("select pg_current_wal_lsn() - %s::pg_lsn", (before,)).fetchone()
    assert written < 100_000, f"10 small reports wrote {written} bytes of WAL"
    assert job_by_id(db, ids[3])["progress"] == {"done": 3}
    assert job_by_id(db, ids[20])["progress"] == big.obj
    db.execute("select pgqueue.complete_many(%s, %s)", (ids[:2], [token, token]))
    assert db.execute("select pgqueue.fail(%s, %s, 'x')", (ids[2], token)).fetchone() == ("queued",)
    (requeued,) = db.execute(
        "select progress from pgqueue.jobs where id = %s", (ids[2],)
    ).fetchone()
    assert requeued == {"done": 2}, "a requeued job keeps the progress it reported"
    db.execute("select pgqueue.complete_many(%s, %s)", (ids[3:], [token] * 47))
    assert db.execute("select count(*) from pgqueue.claims").fetchone() == (0,)
    assert db.execute("select count(*) from pgqueue.job_progress").fetchone() == (0,)


def test_the_first_reports_of_a_claims_jobs_at_once_do_not_deadlock(
    flow: psycopg.Connection, stack: Cluster
) -> None:
    """The handlers of one claim's jobs report progress at the same moment (a worker runs
    them concurrently, over the Data API a connection each). The first report of a claim flags
    it: taken after a share lock on the claim, that update deadlocked two first reports, and
    the handler whose report lost failed its job. 30 claims of 6 jobs, 6 reports at once each."""
    db = flow
    errors: list[str] = []
    reporters = 6
    barrier = threading.Barrier(reporters)
    connections = [stack.connect(autocommit=True) for _ in range(reporters)]
    try:
        for _ in range(30):
            ids = enqueue_n(db, reporters, **AS_ROWS)
            token = complete_and_claim(db, max_jobs=reporters)[0]["lock_token"]

            def report(conn: psycopg.Connection, job_id: int, token: str) -> None:
                barrier.wait(10)
                try:
                    conn.execute(
                        "select pgqueue.progress(%s, %s, %s)", (job_id, token, Jsonb({"at": 1}))
                    )
                except psycopg.Error as error:
                    errors.append(str(error).splitlines()[0])

            threads = [
                threading.Thread(target=report, args=(conn, job_id, token))
                for conn, job_id in zip(connections, ids, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert errors == []
            assert [job_by_id(db, i)["progress"] for i in ids] == [{"at": 1}] * reporters
            db.execute("select pgqueue.complete_many(%s, %s)", (ids, [token] * reporters))
    finally:
        for conn in connections:
            conn.close()


def test_results_and_progress_are_read_by_job_id(flow: psycopg.Connection) -> None:
    db = flow
    with_result, without = enqueue_n(db, 2)
    batch = complete_and_claim(db, max_jobs=2)
    token = batch[0]["lock_token"]
    assert db.execute(
        "select pgqueue.progress(%s, %s, %s)", (with_result, token, Jsonb({"done": 40}))
    ).fetchone() == (True,)
    assert job_by_id(db, with_result)["progress"] == {"done": 40}
    assert db.execute(
        "select pgqueue.progress(%s, gen_random_uuid(), '{}')", (with_result,)
    ).fetchone() == (False,), "a stale token reports nothing"
    db.execute(
        "select * from pgqueue.complete_and_claim('w', %s, %s, 0, done_results => %s::jsonb[])",
        (
            [with_result, without],
            [token, token],
            [Jsonb({"rows": 12}), None],
        ),
    )
    done = job_by_id(db, with_result)
    assert (done["status"], done["result"]) == ("done", {"rows": 12})
    assert (job_by_id(db, without)["status"], job_by_id(db, without)["result"]) == ("done", None)
    assert db.execute("select count(*) from pgqueue.job(12345)").fetchone() == (0,)


def test_complete_stores_a_result_and_refuses_one_too_big(flow: psycopg.Connection) -> None:
    db = flow
    (job_id,) = enqueue_n(db, 1)
    (claimed,) = complete_and_claim(db)
    big = Jsonb({"blob": "x" * 70_000})
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="the limit is 65536"):
        db.execute("select pgqueue.complete(%s, %s, %s)", (job_id, claimed["lock_token"], big))
    assert job(db, job_id)["status"] == "running", "nothing changed"
    assert db.execute(
        "select pgqueue.complete(%s, %s, '\"ok\"')", (job_id, claimed["lock_token"])
    ).fetchone() == (True,)
    assert job_by_id(db, job_id)["result"] == "ok"
