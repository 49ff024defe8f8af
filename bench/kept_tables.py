"""What `claimed_keys` and `job_progress` buy: `bench/run --kept-tables`.

Issue 48 keeps a table only where the performance log shows what it buys. Two of the queue's
tables hold what a claim row could hold instead, since a claim keeps its jobs whole
(`claims.jobs`, each a `claimed_job` with its idempotency key and its progress):

- `claimed_keys`, the idempotency keys of running jobs. Merged, `key_holder()` (which every
  enqueue with a key calls) would search the running claims' jobs instead of probing the
  table's primary key. Measured: `enqueue()` of a job with a new key, and `enqueue_many()` of
  100 such jobs, while RUNNING keyed jobs run, with `key_holder()` as it is and as the merged
  design would write it (redefined on the bench's cluster, then put back).
- `job_progress`, the progress running jobs report. Merged, `progress()` would rewrite the
  reporting job in its claim's array of jobs instead of upserting one small row. Measured: a
  claim of 100 jobs, each reporting progress once, through `progress()` as it is, and through
  the statement the merged design would run in its place.

Figures per job (a call each, but enqueue_many()'s 100): the backend's CPU time and the WAL
written, medians of the repeats, the two designs taking turns on the same cluster.
"""

from __future__ import annotations

import json
import time

import psycopg

from .queue_sql import CLAIM_BATCH, backend_cpu_s, state_tables
from .stack import SCHEMA, Stack

RUNNING = 400  # keyed jobs running while keyed enqueues are measured: four claims of 100
KEYED_ENQUEUES = 2_000
KEYED_BATCHES = 100  # enqueue_many() calls of CLAIM_BATCH keyed jobs each
PROGRESS_CLAIMS = 10  # claims of CLAIM_BATCH jobs, each job reporting once

KEY_HOLDER_MERGED = f"""
create or replace function {SCHEMA}.key_holder(key text)
returns bigint
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
  return coalesce(
    (select e.id
     from {SCHEMA}.claims as c
     cross join lateral unnest(c.jobs) as e
     where e.idempotency_key = key_holder.key and not e.id = any (c.ended)
     limit 1),
    (select h.id
     from {SCHEMA}.job_history as h
     where h.idempotency_key = key_holder.key
     order by h.finished_at desc
     limit 1)
  );
end;
$$;
"""

PROGRESS_KEPT = f"select {SCHEMA}.progress(%s, %s, %s::jsonb)"
# what progress() would write, merged: the job rewritten in its claim's array
PROGRESS_MERGED = f"""
update {SCHEMA}.claims as c
set jobs = array(
  select case when e.id = %(id)s
              then jsonb_populate_record(e, jsonb_build_object('progress', %(progress)s::jsonb))
              else e end
  from unnest(c.jobs) as e
)
where c.lock_token = %(token)s and %(id)s = any (c.ids) and not %(id)s = any (c.ended)
"""


def _measure(conn: psycopg.Connection, calls) -> tuple[float, float]:
    """Backend CPU (µs) and WAL (bytes) over `calls()`, with how many calls it made."""
    pid = conn.info.backend_pid
    lsn = conn.execute("select pg_current_wal_lsn()").fetchone()[0]
    cpu = backend_cpu_s(pid)
    n = calls()
    cpu = backend_cpu_s(pid) - cpu
    wal = conn.execute("select pg_current_wal_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0]
    return cpu * 1e6 / n, float(wal) / n


def _reset(conn: psycopg.Connection) -> None:
    conn.execute(f"truncate {', '.join(state_tables(conn))}")


def _claim(conn: psycopg.Connection, worker: str) -> list[tuple[int, str]]:
    return conn.execute(
        f"select id, lock_token::text from {SCHEMA}.complete_and_claim(%s, max_jobs => %s)",
        (worker, CLAIM_BATCH),
    ).fetchall()


def _keyed_enqueues(conn: psycopg.Connection, round_: int, merged: bool) -> dict[str, tuple]:
    _reset(conn)
    conn.execute(
        f"insert into {SCHEMA}.jobs (kind, idempotency_key) "
        "select 'noop', 'running-' || n from generate_series(1, %s) as n",
        (RUNNING,),
    )
    conn.execute(f"vacuum analyze {SCHEMA}.jobs")
    for i in range(RUNNING // CLAIM_BATCH):
        _claim(conn, f"runner-{i}")
    tag = f"{'m' if merged else 'k'}{round_}"
    one = f"select {SCHEMA}.enqueue('noop', idempotency_key => %s)"
    many = f"select count(*) from {SCHEMA}.enqueue_many(%s::jsonb)"

    def enqueue_one() -> int:
        for n in range(KEYED_ENQUEUES):
            conn.execute(one, (f"{tag}-one-{n}",), prepare=True)
        return KEYED_ENQUEUES

    def enqueue_batches() -> int:
        for b in range(KEYED_BATCHES):
            jobs = [
                {"kind": "noop", "idempotency_key": f"{tag}-many-{b}-{n}"}
                for n in range(CLAIM_BATCH)
            ]
            conn.execute(many, (json.dumps(jobs),), prepare=True)
        return KEYED_BATCHES * CLAIM_BATCH

    figures = {
        "enqueue_keyed": _measure(conn, enqueue_one),
        "enqueue_many_keyed": _measure(conn, enqueue_batches),
    }
    # Either design must find a running job by its key, or it measured another question.
    holder, running = conn.execute(
        f"select {SCHEMA}.key_holder('running-1'), "
        f"(select e.id from {SCHEMA}.claims as c, unnest(c.jobs) as e "
        " where e.idempotency_key = 'running-1')"
    ).fetchone()
    if holder is None or holder != running:
        raise RuntimeError(f"key_holder() ({'merged' if merged else 'kept'}) found {holder}")
    return figures


def _progress(conn: psycopg.Connection, merged: bool) -> tuple[float, float]:
    _reset(conn)
    conn.execute(
        f"insert into {SCHEMA}.jobs (kind) select 'noop' from generate_series(1, %s)",
        (PROGRESS_CLAIMS * CLAIM_BATCH,),
    )
    conn.execute(f"vacuum analyze {SCHEMA}.jobs")
    claimed = [row for i in range(PROGRESS_CLAIMS) for row in _claim(conn, f"reporter-{i}")]
    progress = json.dumps({"done": 50, "of": 100, "note": "halfway"})

    def report() -> int:
        for job_id, token in claimed:
            if merged:
                conn.execute(
                    PROGRESS_MERGED,
                    {"id": job_id, "token": token, "progress": progress},
                    prepare=True,
                )
            else:
                conn.execute(PROGRESS_KEPT, (job_id, token, progress), prepare=True)
        return len(claimed)

    figures = _measure(conn, report)
    # Either design must leave every report readable, as running_jobs shows them.
    shown = conn.execute(
        f"select count(*) from {SCHEMA}.running_jobs where progress ->> 'note' = 'halfway'"
    ).fetchone()[0]
    if shown != len(claimed):
        raise RuntimeError(
            f"{shown} of {len(claimed)} reports shown ({'merged' if merged else 'kept'})"
        )
    return figures


def run(stack: Stack, repeats: int) -> dict[str, dict[str, list]]:
    with stack.cluster.connect(autocommit=True) as conn:
        kept_key_holder = conn.execute(
            "select pg_get_functiondef(%s::regprocedure)", (f"{SCHEMA}.key_holder(text)",)
        ).fetchone()[0]
        raw: dict[str, dict[str, list]] = {}

        def add(name: str, figures: tuple[float, float]) -> None:
            per = raw.setdefault(name, {"server_cpu_us_per_job": [], "wal_bytes_per_job": []})
            per["server_cpu_us_per_job"].append(round(figures[0], 2))
            per["wal_bytes_per_job"].append(round(figures[1], 1))

        try:
            for r in range(repeats):
                for merged in (r % 2 == 1, r % 2 == 0):
                    design = "merged" if merged else "kept"
                    conn.execute(KEY_HOLDER_MERGED if merged else kept_key_holder)
                    for name, figures in _keyed_enqueues(conn, r, merged).items():
                        add(f"{name}_{design}", figures)
                    add(f"progress_{design}", _progress(conn, merged))
                    time.sleep(0.2)
        finally:
            conn.execute(kept_key_holder)
    return raw
