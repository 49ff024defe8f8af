"""Recurring jobs in a time zone, on a real PostgreSQL, with the clock moved: the per-minute
run (_run_schedules(now)) fires each schedule at its local times across daylight-saving
changes, once each; a schedule with catch-up runs one missed slot after an outage, one without
none; bad time zones and cron expressions are refused; the `schedules` view shows the next
runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest

from tests.support.jobs import job


def at(text: str) -> datetime:
    """An instant written in UTC, '2027-03-28 01:00'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def define(
    db: psycopg.Connection,
    name: str,
    cron: str,
    *,
    since: str,
    time_zone: str = "Europe/Paris",
    catch_up: bool = False,
) -> None:
    """A schedule that has looked for slots up to `since` (UTC), as if defined then."""
    with db.transaction():
        db.execute(
            "select pgqueue.schedule(%s, %s, 'report', '{\"to\": \"ops\"}', 'reports', %s, %s)",
            (name, cron, time_zone, catch_up),
        )
        db.execute(
            "update pgqueue.schedules_defined set checked_until = %s where name = %s",
            (at(since), name),
        )


def run_minutes(db: psycopg.Connection, first: str, last: str) -> dict[str, list[datetime]]:
    """Calls the per-minute run once a minute from `first` to `last` (UTC), as pg_cron would:
    the slots each schedule enqueued a job for."""
    rows = db.execute(
        "select r.schedule, r.slot, r.job_id"
        " from generate_series(%s::timestamptz, %s, '1 minute') as t,"
        " lateral pgqueue._run_schedules(t) as r order by t, r.schedule",
        (at(first), at(last)),
    ).fetchall()
    fired: dict[str, list[datetime]] = {}
    for schedule, slot, job_id in rows:
        fired.setdefault(schedule, []).append(slot)
        key = job(db, job_id)["idempotency_key"]
        assert key == f"schedule:{schedule}:{slot.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    return fired


def hours(first: str, last: str) -> list[datetime]:
    start, end = at(first), at(last)
    return [start + timedelta(hours=n) for n in range(int((end - start) / timedelta(hours=1)) + 1)]


def test_a_schedule_in_paris_fires_at_local_times_across_the_spring_change(
    flow: psycopg.Connection,
) -> None:
    """2027-03-28: Paris goes from 02:00 CET to 03:00 CEST. 02:30 does not exist that day: the
    02:30 schedule fires once, at the gap's end (03:00 CEST, 01:00 UTC), as Vixie cron does;
    09:00 is 07:00 UTC from then on; an hourly schedule follows the clock, every hour once."""
    db = flow
    define(db, "night", "30 2 * * *", since="2027-03-26 23:59")
    define(db, "morning", "0 9 * * *", since="2027-03-26 23:59")
    define(db, "hourly", "0 * * * *", since="2027-03-26 23:59")
    fired = run_minutes(db, "2027-03-27 00:00", "2027-03-29 09:00")
    assert fired["night"] == [
        at("2027-03-27 01:30"), at("2027-03-28 01:00"), at("2027-03-29 00:30")
    ]  # fmt: skip
    assert fired["morning"] == [
        at("2027-03-27 08:00"), at("2027-03-28 07:00"), at("2027-03-29 07:00")
    ]  # fmt: skip
    assert fired["hourly"] == hours("2027-03-27 00:00", "2027-03-29 09:00")
    assert db.execute(
        "select last_slot from pgqueue.schedules where name = 'night'"
    ).fetchone() == (at("2027-03-29 00:30"),)


def test_a_schedule_in_paris_fires_at_local_times_across_the_autumn_change(
    flow: psycopg.Connection,
) -> None:
    """2027-10-31: Paris goes from 03:00 CEST back to 02:00 CET. 02:30 comes twice: the 02:30
    schedule fires at the first (00:30 UTC) only; the hourly one fires at both 02:00s."""
    db = flow
    define(db, "night", "30 2 * * *", since="2027-10-29 23:59")
    define(db, "morning", "0 9 * * *", since="2027-10-29 23:59")
    define(db, "hourly", "0 * * * *", since="2027-10-29 23:59")
    fired = run_minutes(db, "2027-10-30 00:00", "2027-11-01 09:00")
    assert fired["night"] == [
        at("2027-10-30 00:30"), at("2027-10-31 00:30"), at("2027-11-01 01:30")
    ]  # fmt: skip
    assert fired["morning"] == [
        at("2027-10-30 07:00"), at("2027-10-31 08:00"), at("2027-11-01 08:00")
    ]  # fmt: skip
    assert fired["hourly"] == hours("2027-10-30 00:00", "2027-11-01 09:00")
    # the same minutes run again add nothing: each slot has its job
    assert run_minutes(db, "2027-10-31 00:00", "2027-10-31 02:00") == {}


def test_catch_up_runs_one_missed_slot_after_an_outage_and_without_it_none_run(
    flow: psycopg.Connection,
) -> None:
    """Nothing ran from 2027-06-01 05:00 to 2027-06-04 12:00 UTC: four 09:00 slots passed. The
    schedule with catch-up runs once, for the newest (its payload says which, and that it
    was caught up); the one without skips them all; both fire on time the day after."""
    db = flow
    define(db, "with-catch-up", "0 9 * * *", since="2027-06-01 04:59", catch_up=True)
    define(db, "without", "0 9 * * *", since="2027-06-01 04:59")
    assert run_minutes(db, "2027-06-01 05:00", "2027-06-01 05:00") == {}
    (caught,) = db.execute(
        "select r.job_id from pgqueue._run_schedules(%s) as r", (at("2027-06-04 12:00"),)
    ).fetchall()
    row = job(db, caught[0])
    assert row["payload"] == {
        "to": "ops", "_schedule": {"slot": "2027-06-04T07:00:00Z", "caught_up": True}
    }  # fmt: skip
    assert (row["kind"], row["queue"]) == ("report", "reports")
    assert run_minutes(db, "2027-06-04 12:01", "2027-06-05 08:00") == {
        "with-catch-up": [at("2027-06-05 07:00")],
        "without": [at("2027-06-05 07:00")],
    }
    (on_time,) = db.execute(
        "select payload from pgqueue.jobs"
        " where idempotency_key = 'schedule:with-catch-up:2027-06-05T07:00:00Z'"
    ).fetchone()
    assert on_time["_schedule"] == {"slot": "2027-06-05T07:00:00Z", "caught_up": False}
    # a run a few minutes late (pg_cron busy) is not an outage: the slot runs, catch-up or not
    assert run_minutes(db, "2027-06-06 07:03", "2027-06-06 07:03") == {
        "with-catch-up": [at("2027-06-06 07:00")],
        "without": [at("2027-06-06 07:00")],
    }


@pytest.mark.parametrize(
    ("cron", "time_zone", "refusal"),
    [
        ("0 9 * * *", "Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"),
        ("0 9 * * *", "", "unknown time zone ''"),
        ("every day", "UTC", "a cron expression has five fields"),
        ("@reboot", "UTC", "a cron expression has five fields"),
        ("0 9 * * * 2027", "UTC", "a cron expression has five fields"),
        ("61 * * * *", "UTC", "the minute field of cron expression '61 \\* \\* \\* \\*' cannot"),
        ("0 24 * * *", "UTC", "the hour field .* at '24'"),
        ("0 9 0 * *", "UTC", "the day of the month field .* at '0'"),
        ("0 9 * 13 *", "UTC", "the month field .* at '13'"),
        ("0 9 * foo *", "UTC", "the month field .* at 'foo'"),
        ("0 9 * * 8", "UTC", "the day of the week field .* at '8'"),
        ("0 9 * * mon-xyz", "UTC", "the day of the week field .* at 'mon-xyz'"),
        ("30-10 * * * *", "UTC", "the minute field .* at '30-10'"),
        ("*/0 * * * *", "UTC", "the minute field .* at '\\*/0'"),
        ("0 9 L * *", "UTC", "the day of the month field .* at 'l'"),
        ("0 0 31 2 *", "UTC", "'0 0 31 2 \\*' never comes"),
        ("30 seconds", "Europe/Paris", "a schedule in seconds runs in UTC only"),
    ],
)
def test_a_bad_time_zone_or_cron_expression_is_refused_saying_what_is_wrong(
    flow: psycopg.Connection, cron: str, time_zone: str, refusal: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=refusal) as refused:
        flow.execute(
            "select pgqueue.schedule('bad', %s, 'report', time_zone => %s)", (cron, time_zone)
        )
    assert refused.value.diag.message_hint, "the refusal says what to give instead"
    assert flow.execute("select count(*) from pgqueue.schedules_defined").fetchone() == (0,)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="in seconds runs in UTC only"):
        flow.execute("select pgqueue.schedule('s', '30 seconds', 'k', catch_up => true)")


@pytest.mark.parametrize(
    ("cron", "after", "runs"),
    [
        # lists, ranges, steps and names
        ("*/20 9-10 * jan,mar mon-fri", "2027-01-01 00:00",
         ["2027-01-01 09:00", "2027-01-01 09:20", "2027-01-01 09:40", "2027-01-01 10:00"]),
        ("5/15 * * * *", "2027-01-01 00:00",
         ["2027-01-01 00:05", "2027-01-01 00:20", "2027-01-01 00:35", "2027-01-01 00:50"]),
        ("10-40/15 3 * * *", "2027-01-01 00:00",
         ["2027-01-01 03:10", "2027-01-01 03:25", "2027-01-01 03:40", "2027-01-02 03:10"]),
        # with both day fields set, a day of either (2027-02-07 and 14 are Sundays, 7 = 0)
        ("0 12 1,15 * 7", "2027-02-01 00:00",
         ["2027-02-01 12:00", "2027-02-07 12:00", "2027-02-14 12:00", "2027-02-15 12:00"]),
        # a day of the month starting with *: both fields apply (the week's is any day)
        ("15 10 */10 * *", "2027-01-25 00:00",
         ["2027-01-31 10:15", "2027-02-01 10:15", "2027-02-11 10:15", "2027-02-21 10:15"]),
        # pg_cron's shorthands (2027-01-03 is a Sunday)
        ("@weekly", "2027-01-01 00:00",
         ["2027-01-03 00:00", "2027-01-10 00:00", "2027-01-17 00:00", "2027-01-24 00:00"]),
        ("@HOURLY", "2027-01-01 00:00",
         ["2027-01-01 01:00", "2027-01-01 02:00", "2027-01-01 03:00", "2027-01-01 04:00"]),
        # the search looks through 1500 days: the next 29 February, not the one after
        ("0 0 29 feb *", "2027-01-01 00:00", ["2028-02-29 00:00"]),
    ],
)  # fmt: skip
def test_cron_expressions_are_read_as_cron_reads_them(
    flow: psycopg.Connection, cron: str, after: str, runs: list[str]
) -> None:
    (found,) = flow.execute(
        "select array(select r.fire_at from pgqueue._cron_runs(pgqueue._cron_bits(%s), 'UTC',"
        " %s, %s::timestamptz + interval '1500 days', false, 4) as r)",
        (cron, at(after), at(after)),
    ).fetchone()
    assert found == [at(run) for run in runs]


def test_the_schedules_view_shows_the_zone_catch_up_and_next_runs(
    flow: psycopg.Connection,
) -> None:
    """The next 3 runs, as instants and as the local times they stand for, agree with Python's
    zoneinfo; across a change a skipped local time stands for the gap's end."""
    db = flow
    db.execute(
        "select pgqueue.schedule('morning', '0 9 * * *', 'report', time_zone => 'europe/paris',"
        " catch_up => true)"
    )
    row = db.execute(
        "select time_zone, catch_up, last_slot, next_runs, next_runs_local, active,"
        " now() from pgqueue.schedules"
    ).fetchone()
    zone, catch_up, last_slot, next_runs, next_local, active, now = row
    assert (zone, catch_up, last_slot, active) == ("Europe/Paris", True, None, True)
    paris = ZoneInfo("Europe/Paris")
    day = now.astimezone(paris).date()
    expected = [
        datetime(d.year, d.month, d.day, 9, tzinfo=paris)
        for d in (day + timedelta(days=n) for n in range(5))
    ]
    expected = [t for t in expected if t > now][:3]
    assert next_runs == expected
    assert next_local == [t.replace(tzinfo=None) for t in expected]
    spring = db.execute(
        "select r.slot, r.fire_at from pgqueue._cron_runs(pgqueue._cron_bits('30 2 * * *'),"
        " 'Europe/Paris', '2027-03-26 12:00Z', '2027-04-30Z', false, 3) as r"
    ).fetchall()
    assert spring == [
        (datetime(2027, 3, 27, 2, 30), at("2027-03-27 01:30")),
        (datetime(2027, 3, 28, 2, 30), at("2027-03-28 01:00")),  # at the gap's end, 03:00 CEST
        (datetime(2027, 3, 29, 2, 30), at("2027-03-29 00:30")),
    ]


def test_a_schedule_that_fails_stops_no_other(flow: psycopg.Connection) -> None:
    """One pg_cron job runs every schedule: one that cannot enqueue (here its time zone gone
    from the database's tzdata) is skipped with a warning, and the others still fire."""
    db = flow
    define(db, "broken", "0 9 * * *", since="2027-06-01 06:59")
    define(db, "fine", "0 9 * * *", since="2027-06-01 06:59")
    db.execute(
        "update pgqueue.schedules_defined set time_zone = 'Nowhere/Gone' where name = 'broken'"
    )
    warnings: list[str] = []
    db.add_notice_handler(lambda notice: warnings.append(notice.message_primary))
    assert run_minutes(db, "2027-06-01 07:00", "2027-06-01 07:00") == {
        "fine": [at("2027-06-01 07:00")]
    }
    assert warnings == [
        'pgqueue: schedule broken enqueued nothing: time zone "Nowhere/Gone" not recognized'
    ]
