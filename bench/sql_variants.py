"""Where the SQL API's time goes, and what changes to it would buy: `bench/run --sql-variants`.

Every variant is the rendered migrations applied again under a scratch schema of its own
(`pgqueue` renamed), with one change made by text substitution or by SQL appended, so each
is measured against an unchanged copy (`v_base`) on the same cluster in the same run, in
alternating order. Nothing here changes the template: the winners are proposals for a new
migration (see docs/maintainers/performance-log.md).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import psycopg

from .queue_sql import CLAIM_BATCH, ENQUEUE_BATCH, percentile
from .stack import REPO, SCHEMA, Stack, render_source


def _replace(sql: str, old: str, new: str) -> str:
    if sql.count(old) != 1:
        raise RuntimeError(f"the migrations changed; a variant no longer applies: {old!r}")
    return sql.replace(old, new)


def _replace_in_last(sql: str, definition: str, old: str, new: str) -> str:
    """_replace() within the last `definition` of the migrations (and what follows it): the
    one in force."""
    start = sql.rfind(definition)
    if start < 0:
        raise RuntimeError(f"the migrations changed; a variant no longer applies: {definition!r}")
    return sql[:start] + _replace(sql[start:], old, new)


def variants(schema_sql: str) -> dict[str, tuple[str, str]]:
    """name -> (migration SQL for that schema, SQL appended after it)."""
    return {
        "v_base": (schema_sql, ""),
        "v_no_finished_idx": (schema_sql, "drop index {s}.jobs_finished_idx;"),
        "v_no_wake_trigger": (schema_sql, "drop trigger jobs_wake_workers on {s}.jobs;"),
        # claim() commits asynchronously: measured, and not adopted
        # (docs/maintainers/performance-log.md, proposal 3)
        "v_claim_async_commit": (
            _replace_in_last(
                schema_sql,
                "function {s}.claim(",
                "\nbegin\n  if claim.max_jobs is null",
                "\nbegin\n"
                "  perform set_config('synchronous_commit', 'off', true);\n"
                "  if claim.max_jobs is null",
            ),
            "",
        ),
    }


def patch_claim_async_commit(stack: Stack) -> None:
    """What-if (`--patch claim_async_commit`): claim() makes its own transaction's commit
    asynchronous, so the worker need not wait for the claim's WAL flush. Not adopted: a claim
    lost in a crash puts its jobs back to `queued` with the attempt uncounted, so the same
    attempt can run twice (tests/reliability/test_restart.py caught it)."""
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
}


def _install(stack: Stack, project: Path) -> dict[str, str]:
    """Create every variant's schema; returns name -> schema."""
    # 0.1.0's schema and functions, which these variants were written against (its four
    # migrations, rendered for the project's answers); not the sweeper's pg_cron schedule.
    sources = sorted(
        (REPO / "template/supabase/migrations").glob("*20261202*_pgqueue_*"), key=lambda p: p.name
    )
    sql = "\n".join(render_source(project, p.relative_to(REPO).as_posix()) for p in sources)
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


def _enqueue(conn: psycopg.Connection, s: str, jobs: int) -> dict[str, float]:
    conn.execute(f"truncate {s}.jobs")
    batches = [
        json.dumps([{"kind": "noop", "payload": {"n": n}} for n in range(i, i + ENQUEUE_BATCH)])
        for i in range(0, jobs, ENQUEUE_BATCH)
    ]
    per_call = []
    started = time.perf_counter()
    for batch in batches:
        t0 = time.perf_counter()
        conn.execute(f"select count(*) from {s}.enqueue_many(%s::jsonb)", (batch,), prepare=True)
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
                figures |= _enqueue(conn, name, jobs * 2)
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
