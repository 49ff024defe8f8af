"""What 1.4.0's step does to a 1.3.0 project's recurring jobs: each five-field schedule, run
until then by a pg_cron job of its own, moves to the per-minute job (`pgqueue-schedules`) and
keeps firing in UTC, on the same slots, with the same idempotency keys; one the queue cannot
read (pg_cron 1.4 takes `1#2`, the second Monday) keeps its own pg_cron job."""

from __future__ import annotations

from pathlib import Path

from testkit.hosted import start_hosted_cluster
from testkit.project import RELEASES, push_migrations, render_repo, supabase, update


def test_a_project_updated_from_1_3_0_keeps_its_schedules_firing_in_utc(
    history: Path, tmp_path: Path
) -> None:
    project = render_repo(
        history, tmp_path / "app", "generated at 1.3.0", vcs_ref=RELEASES["1.3.0"]
    )
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("select pgqueue.schedule('nightly', '0 3 * * *', 'report', '{\"n\": 1}')")
            db.execute("select pgqueue.schedule('often', '*/5 * * * *', 'ping', queue => 'pings')")
            db.execute("select pgqueue.schedule('daily', '@daily', 'ping')")
            db.execute("select pgqueue.schedule('second-monday', '0 0 * * 1#2', 'ping')")
            before = db.execute(
                "select jobname from cron.job where jobname like 'pgqueue-schedule%' order by 1"
            ).fetchall()
            assert len(before) == 4
        update(project, "HEAD")
        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            assert db.execute(
                "select name, cron, kind, payload, queue, time_zone, catch_up, active"
                " from pgqueue.schedules order by name"
            ).fetchall() == [
                ("daily", "@daily", "ping", {}, "default", "UTC", False, True),
                ("nightly", "0 3 * * *", "report", {"n": 1}, "default", "UTC", False, True),
                ("often", "*/5 * * * *", "ping", {}, "pings", "UTC", False, True),
                ("second-monday", "0 0 * * 1#2", "ping", {}, "default", "UTC", False, True),
            ]
            assert db.execute(
                "select jobname, schedule, command from cron.job"
                " where jobname like 'pgqueue-schedule%' order by 1"
            ).fetchall() == [
                ("pgqueue-schedule-second-monday", "0 0 * * 1#2",
                 "select pgqueue.enqueue_scheduled('second-monday')"),
                ("pgqueue-schedules", "* * * * *", "select pgqueue._run_schedules()"),
            ]  # fmt: skip
            # the next 03:00 UTC: both fire, keyed as 1.3.0 keyed them
            (three,) = db.execute(
                "select date_trunc('day', now() at time zone 'UTC') at time zone 'UTC'"
                " + interval '1 day 3 hours'"
            ).fetchone()
            (next_runs,) = db.execute(
                "select next_runs from pgqueue.schedules where name = 'nightly'"
            ).fetchone()
            assert next_runs[0] == three
            ran = db.execute(
                "select r.schedule, r.job_id from pgqueue._run_schedules(%s) as r", (three,)
            ).fetchall()
            fired = [
                (schedule, *db.execute(
                    "select idempotency_key, kind, queue from pgqueue.jobs where id = %s",
                    (job_id,),
                ).fetchone())
                for schedule, job_id in sorted(ran)
            ]  # fmt: skip
            day = f"{three:%Y-%m-%d}"
            assert fired == [
                ("nightly", f"schedule:nightly:{day}T03:00:00Z", "report", "default"),
                ("often", f"schedule:often:{day}T03:00:00Z", "ping", "pings"),
            ]
    finally:
        cluster.destroy()
