"""Where the SQL API's time goes, and what changes to it would buy: `bench/run --sql-variants`.

Every variant is the rendered migrations applied again under a scratch schema of its own
(`pgqueue` renamed), with one change made by text substitution or by SQL appended, so each
is measured against an unchanged copy (`v_base`) on the same cluster in the same run, in
alternating order. Nothing here changes the template: the winners are proposals for a new
migration (see docs/performance.md).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import psycopg

from .queue_sql import CLAIM_BATCH, ENQUEUE_BATCH, percentile
from .stack import SCHEMA, Stack

# plan caching: plpgsql keeps a function's plans for the session; a `language sql` function
# that returns a set is planned again on every call (before PostgreSQL 18).
COMPLETE_MANY_PLPGSQL = (
    "returns setof bigint\nlanguage sql\nvolatile\nsecurity definer\nset search_path = ''\n"
    "as $$\n  update {s}.jobs as j\n  set status = 'done', finished_at = now(), "
    "locked_until = null, lock_token = null\n  from unnest(complete_many.job_ids, "
    "complete_many.lock_tokens) as t(id, token)\n  where j.id = t.id\n    and j.lock_token = "
    "t.token\n    and j.status = 'running'\n  returning j.id\n$$;",
    "returns setof bigint\nlanguage plpgsql\nvolatile\nsecurity definer\nset search_path = ''\n"
    "as $$\nbegin\n  return query\n  update {s}.jobs as j\n  set status = 'done', finished_at = "
    "now(), locked_until = null, lock_token = null\n  from unnest(complete_many.job_ids, "
    "complete_many.lock_tokens) as t(id, token)\n  where j.id = t.id\n    and j.lock_token = "
    "t.token\n    and j.status = 'running'\n  returning j.id;\nend;\n$$;",
)

# enqueue_many without idempotency keys in the batch (the common case): one INSERT, no
# left join back to the input and no per-element key lookup.
ENQUEUE_FAST_PATH = """
create or replace function {s}.enqueue_many_fast(jobs jsonb)
returns setof bigint
language plpgsql
volatile
security definer
set search_path = ''
as $$
begin
  if jsonb_typeof(enqueue_many_fast.jobs) is distinct from 'array' then
    raise exception 'enqueue_many expects a JSON array' using errcode = '22023';
  end if;
  if jsonb_path_exists(enqueue_many_fast.jobs, '$[*].idempotency_key ? (@ != null)') then
    return query select {s}.enqueue_many(enqueue_many_fast.jobs);
    return;
  end if;
  return query
    with input as materialized (
      select nextval('{s}.jobs_id_seq') as id, t.*
      from rows from (
        jsonb_to_recordset(enqueue_many_fast.jobs) as (
          kind text, payload jsonb, run_after timestamptz, queue text, priority integer,
          max_attempts integer
        )
      ) with ordinality as t(kind, payload, run_after, queue, priority, max_attempts, ord)
    ),
    inserted as (
      insert into {s}.jobs (id, queue, kind, payload, priority, max_attempts, run_after)
      overriding system value
      select i.id, coalesce(i.queue, 'default'), i.kind, coalesce(i.payload, '{}'::jsonb),
             coalesce(i.priority, 0), coalesce(i.max_attempts, 5), coalesce(i.run_after, now())
      from input as i
      order by i.ord
    )
    select i.id from input as i order by i.ord;
end;
$$;
"""


def _replace(sql: str, old: str, new: str) -> str:
    if sql.count(old) != 1:
        raise RuntimeError(f"the migrations changed; a variant no longer applies: {old!r}")
    return sql.replace(old, new)


def variants(schema_sql: str) -> dict[str, tuple[str, str]]:
    """name -> (migration SQL for that schema, SQL appended after it)."""
    s = "{s}"
    return {
        "v_base": (schema_sql, ""),
        "v_complete_plpgsql": (
            _replace(
                schema_sql,
                COMPLETE_MANY_PLPGSQL[0].format(s=s),
                COMPLETE_MANY_PLPGSQL[1].format(s=s),
            ),
            "",
        ),
        # The token alone picks the row: jobs_lease_check makes `lock_token is not null` mean
        # `status = 'running'`, and without the status test the planner has no reason to scan
        # jobs_lease_expiry_idx (every running job) and nested-loop it against the batch.
        "v_complete_by_token": (
            _replace(
                schema_sql,
                "    and j.lock_token = t.token\n    and j.status = 'running'\n  returning j.id\n",
                "    and j.lock_token = t.token\n  returning j.id\n",
            ),
            "",
        ),
        "v_no_finished_idx": (schema_sql, "drop index {s}.jobs_finished_idx;"),
        "v_no_wake_trigger": (schema_sql, "drop trigger jobs_wake_workers on {s}.jobs;"),
        "v_enqueue_fast": (schema_sql, ENQUEUE_FAST_PATH),
    }


def patch_complete_many(stack: Stack) -> None:
    """What-if (`bench/run --patch complete_by_token`): apply v_complete_by_token's change to
    the real queue on the benchmark's cluster, so the whole run measures the proposal."""
    with stack.cluster.connect(autocommit=True) as conn:
        definition = conn.execute(
            "select pg_get_functiondef(%s::regprocedure)",
            (f"{SCHEMA}.complete_many(bigint[], uuid[])",),
        ).fetchone()[0]
        conn.execute(_replace(definition, "\n    and j.status = 'running'", ""))


def patch_claim_async_commit(stack: Stack) -> None:
    """What-if (`--patch claim_async_commit`): claim() makes its own transaction's commit
    asynchronous. A claim lost in a crash only puts the job back to `queued` (it runs again,
    as at-least-once allows), so the worker need not wait for the claim's WAL flush."""
    with stack.cluster.connect(autocommit=True) as conn:
        definition = conn.execute(
            "select pg_get_functiondef(%s::regprocedure)",
            (f"{SCHEMA}.claim(text, integer, text[], text, integer)",),
        ).fetchone()[0]
        conn.execute(
            _replace(
                definition,
                "\nbegin\n",
                "\nbegin\n  perform set_config('synchronous_commit', 'off', true);\n",
            )
        )


PATCHES = {
    "claim_async_commit": patch_claim_async_commit,
    "complete_by_token": patch_complete_many,
}


def _install(stack: Stack, project: Path) -> dict[str, str]:
    """Create every variant's schema; returns name -> schema."""
    migrations = sorted((project / "supabase" / "migrations").glob("*.sql"))
    # The schema and functions; not the sweeper's pg_cron schedule (a variant needs no sweeps).
    sql = "\n".join(p.read_text() for p in migrations)
    sql = sql.split("create extension if not exists pg_cron")[0]
    template = sql.replace(f"{SCHEMA}.", "{s}.").replace(f"schema {SCHEMA}", "schema {s}")
    template = template.replace(f"if not exists {SCHEMA};", "if not exists {s};")
    template = template.replace(f"'{SCHEMA}'", "'{s}'").replace(f"'{SCHEMA}_", "'{s}_")
    made = {}
    with stack.cluster.connect(autocommit=True) as conn:
        for name, (body, extra) in variants(template).items():
            conn.execute(body.replace("{s}", name))
            if extra:
                conn.execute(extra.replace("{s}", name))
            made[name] = name
    return made


def _claim_complete(
    conn: psycopg.Connection, s: str, jobs: int, running: int = 0
) -> dict[str, float]:
    """One process, claim(100) + complete_many: jobs/s, and each call's statement and commit
    time per row (explicit transactions, so the commit is timed apart). `running` jobs are
    claimed first by another worker and stay running, as other workers' jobs would."""
    conn.execute(f"truncate {s}.jobs")
    conn.execute(
        f"insert into {s}.jobs (kind, payload) select 'noop', jsonb_build_object('n', n) "
        "from generate_series(1, %s) as n",
        (jobs,),
    )
    conn.execute(f"vacuum analyze {s}.jobs")
    if running:
        conn.execute(
            f"insert into {s}.jobs (kind, queue) select 'noop', 'other' "
            "from generate_series(1, %s)",
            (running,),
        )
        conn.execute(f"select count(*) from {s}.claim('other', %s, null, 'other')", (running,))
    claim = f"select id, lock_token from {s}.claim('bench', %s)"
    complete = f"select count(*) from {s}.complete_many(%s::bigint[], %s::uuid[])"
    times = {"claim": [], "claim_commit": [], "complete": [], "complete_commit": []}
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        conn.execute("begin")
        rows = conn.execute(claim, (CLAIM_BATCH,), prepare=True).fetchall()
        t1 = time.perf_counter()
        conn.execute("commit")
        t2 = time.perf_counter()
        if not rows:
            break
        ids, tokens = zip(*rows, strict=True)
        conn.execute("begin")
        conn.execute(complete, (list(ids), list(tokens)), prepare=True).fetchone()
        t3 = time.perf_counter()
        conn.execute("commit")
        t4 = time.perf_counter()
        n = len(rows)
        times["claim"].append((t1 - t0) / n * 1e6)
        times["claim_commit"].append((t2 - t1) * 1e3)
        times["complete"].append((t3 - t2) / n * 1e6)
        times["complete_commit"].append((t4 - t3) * 1e3)
    elapsed = time.perf_counter() - started
    return {
        "jobs_per_s": jobs / elapsed,
        "claim_us_per_row": statistics.median(times["claim"]),
        "complete_many_us_per_row": statistics.median(times["complete"]),
        "commit_after_claim_ms": statistics.median(times["claim_commit"]),
        "commit_after_complete_ms": statistics.median(times["complete_commit"]),
    }


def _enqueue(conn: psycopg.Connection, s: str, jobs: int, function: str) -> dict[str, float]:
    import json

    conn.execute(f"truncate {s}.jobs")
    batches = [
        json.dumps([{"kind": "noop", "payload": {"n": n}} for n in range(i, i + ENQUEUE_BATCH)])
        for i in range(0, jobs, ENQUEUE_BATCH)
    ]
    per_call = []
    started = time.perf_counter()
    for batch in batches:
        t0 = time.perf_counter()
        conn.execute(f"select count(*) from {s}.{function}(%s::jsonb)", (batch,), prepare=True)
        per_call.append((time.perf_counter() - t0) * 1e3)
    return {
        "enqueue_jobs_per_s": jobs / (time.perf_counter() - started),
        "enqueue_ms_per_1000": percentile(per_call, 50),
    }


def run(stack: Stack, project: Path, jobs: int, repeats: int) -> dict[str, dict[str, list]]:
    schemas = _install(stack, project)
    out: dict[str, dict[str, list[float]]] = {}
    with stack.cluster.connect(autocommit=True) as conn:
        for repeat in range(repeats):
            order = list(schemas) if repeat % 2 == 0 else list(reversed(schemas))
            for name in order:
                figures = _claim_complete(conn, name, jobs)
                busy = _claim_complete(conn, name, jobs, running=1000)
                figures |= {f"{k}_1000_running": v for k, v in busy.items() if "commit" not in k}
                function = "enqueue_many_fast" if name == "v_enqueue_fast" else "enqueue_many"
                figures |= _enqueue(conn, name, jobs * 2, function)
                for figure, value in figures.items():
                    out.setdefault(name, {}).setdefault(figure, []).append(value)
    return out


def explain(stack: Stack, jobs: int = 20_000) -> str:
    """EXPLAIN ANALYZE of the statements inside claim() and complete_many(), as they run."""
    s = SCHEMA
    lines = []
    with stack.cluster.connect(autocommit=True) as conn:
        conn.execute(f"truncate {s}.jobs")
        conn.execute(
            f"insert into {s}.jobs (kind) select 'noop' from generate_series(1, %s)", (jobs,)
        )
        conn.execute(f"vacuum analyze {s}.jobs")
        conn.execute("load 'auto_explain'")
        conn.execute("set auto_explain.log_min_duration = 0")
        conn.execute("set auto_explain.log_analyze = on")
        conn.execute("set auto_explain.log_buffers = on")
        conn.execute("set auto_explain.log_nested_statements = on")
        conn.execute("set client_min_messages = log")
        conn.execute("set auto_explain.log_level = notice")
        notes: list[str] = []
        conn.add_notice_handler(lambda diag: notes.append(diag.message_primary or ""))
        for _ in range(3):  # the third call runs on cached plans
            notes.clear()
            rows = conn.execute(f"select id, lock_token from {s}.claim('x', 100)").fetchall()
            ids, tokens = map(list, zip(*rows, strict=True))
            conn.execute(f"select {s}.complete_many(%s::bigint[], %s::uuid[])", (ids, tokens))
        lines += notes
        conn.execute("set auto_explain.log_min_duration = -1")
    return "\n\n".join(lines)
