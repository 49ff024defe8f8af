"""What a release's step changes in the calls it does not aim at, and how long the step takes
on a large history: `python -m bench.release_step` (the step from the newest release by
default, `--previous REF` for another).

A project rendered at the previous release is pushed to a durable cluster; then, in one
connection, the median of `repeats` runs of each call below, in µs a job. Then `history`
finished jobs are written to job_history, and the step migrations HEAD renders for a project
of that baseline are pushed (timed, the Supabase CLI included), and the calls are timed again.

- enqueue_plain, enqueue_keyed: enqueue() a job, without and with a concurrency key (500 keys)
- claim10_fail: claim() 10 jobs, fail() each (due again in an hour)
- claim10_complete: claim() 10 jobs, complete() each

Each figure is `jobs` calls in one DO block (one transaction), so it is the server's cost of
the call, without a commit or a round trip. Before each timing, a table of attempt errors, if
the release has one, gets 20,000 old rows and is analyzed, as autovacuum would have done in a
project that has had failures (the calls' plans are made against it).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from testkit.project import REPO, previous_release, push_migrations, render

from .stack import DURABLE_SETTINGS, SCHEMA

S = SCHEMA
MIGRATIONS = Path("supabase/migrations")
ANSWERS = {"project_name": "Step", "worker_style": "python", "claim_transport": "postgres"}


def _loop(jobs: int, body: str) -> str:
    return f"do $$ declare j record; begin for i in 1..{jobs} loop {body} end loop; end $$"


def _claim_loop(jobs: int, call: str) -> str:
    return _loop(
        jobs // 10,
        f"for j in select * from {S}.claim('bench', 10, array['bench_step']) loop {call}; "
        "end loop;",
    )


def calls(jobs: int) -> dict[str, tuple[str, str]]:
    """Each figure: (set-up statement, timed statement)."""
    fill = f"select {S}.enqueue('bench_step', '{{}}') from generate_series(1, {jobs})"
    return {
        "enqueue_plain": ("select", _loop(jobs, f"perform {S}.enqueue('bench_step', '{{}}');")),
        "enqueue_keyed": (
            "select",
            _loop(
                jobs,
                f"perform {S}.enqueue('bench_step', '{{}}', concurrency_key => 'k' || i % 500);",
            ),
        ),
        "claim10_fail": (
            fill,
            _claim_loop(
                jobs,
                f"perform {S}.fail(j.id, j.lock_token, 'KeyError: x', "
                "retry_in => interval '1 hour')",
            ),
        ),
        "claim10_complete": (fill, _claim_loop(jobs, f"perform {S}.complete(j.id, j.lock_token)")),
    }


def measure(conn: psycopg.Connection, jobs: int, repeats: int) -> dict[str, float]:
    # A table of attempt errors, if the release has one, as a project that has had failures
    # holds it (analyzed, as autovacuum would have: the calls' plans are made against it).
    if conn.execute(f"select to_regclass('{S}.job_errors')").fetchone()[0]:
        conn.execute(
            f"insert into {S}.job_errors (job_id, attempt, at, message) "
            "select 20000000000 + i, 1, now() - interval '1 day', 'Error: old' "
            "from generate_series(1, 20000) as i"
        )
        conn.execute(f"vacuum analyze {S}.job_errors")
    figures: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, (set_up, timed) in calls(jobs).items():
            conn.execute(set_up)
            start = time.perf_counter()
            conn.execute(timed)
            figures.setdefault(name, []).append((time.perf_counter() - start) / jobs * 1e6)
            conn.execute(f"delete from {S}.jobs where kind = 'bench_step'")
    return {name: round(statistics.median(values), 1) for name, values in figures.items()}


def fill_history(conn: psycopg.Connection, rows: int) -> None:
    conn.execute(
        f"insert into {S}.job_history (id, queue, kind, status, payload, priority, attempts, "
        "max_attempts, created_at, finished_at) "
        "select 10000000000 + i, 'default', 'kind_' || i %% 20, "
        "case when i %% 50 = 0 then 'failed' else 'done' end, "
        "case when i %% 50 = 0 then '{}'::jsonb end, 0, 1, 25, now() - interval '8 days', "
        "now() - make_interval(secs => i / 10.0) from generate_series(1, %s) as i",
        (rows,),
    )
    conn.execute(f"vacuum analyze {S}.job_history")


def run(previous: str, jobs: int, history: int, repeats: int) -> dict[str, object]:
    from testkit.stack import start_supabase_like_cluster

    work = Path(tempfile.mkdtemp(prefix="pgqueue-release-step-"))
    cluster = start_supabase_like_cluster(**DURABLE_SETTINGS)
    try:
        old = render(REPO, work / "previous", vcs_ref=previous, **ANSWERS)
        push_migrations(old, cluster.url())
        answers = (old / ".copier-answers.yml").read_text()
        baseline = answers.split("_queue_baseline: ")[1].split()[0]
        new = render(REPO, work / "head", queue_baseline=baseline, **ANSWERS)
        steps = sorted(
            {p.name for p in (new / MIGRATIONS).iterdir()}
            - {p.name for p in (old / MIGRATIONS).iterdir()}
        )
        with cluster.connect(autocommit=True) as conn:
            conn.execute("update cron.job set active = false")
            before = measure(conn, jobs, repeats)
            fill_history(conn, history)
        for name in steps:
            shutil.copy(new / MIGRATIONS / name, old / MIGRATIONS / name)
        start = time.perf_counter()
        push_migrations(old, cluster.url())
        step_s = round(time.perf_counter() - start, 2)
        with cluster.connect(autocommit=True) as conn:
            after = measure(conn, jobs, repeats)
        return {"steps": steps, "step_s": step_s, "before": before, "after": after}
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.release_step", description=__doc__)
    parser.add_argument(
        "--previous", help="the release to step from (a ref; default: the newest release)"
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="calls per figure")
    parser.add_argument("--history", type=int, default=1_000_000, help="finished jobs kept")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = run(args.previous or previous_release(), args.jobs, args.history, args.repeats)
    print(f"steps: {', '.join(result['steps'])}")
    print(f"the step with {args.history:,} finished jobs kept: {result['step_s']} s")
    print(f"{'µs a job (median)':<20}{'before':>10}{'after':>10}")
    for name, value in result["before"].items():
        print(f"{name:<20}{value:>10}{result['after'][name]:>10}")


if __name__ == "__main__":
    main()
