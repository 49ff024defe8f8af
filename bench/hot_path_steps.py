"""What each change of the hot path bought: `bench/run --hot-path-steps`.

Migration 20261203000003 made four changes to the claim-and-complete loop at once. Here each
one is a step, measured on a scratch schema of its own, from the loop before the migration to
the hot path as that migration left it; then the flow-control migration's hot path, pgqueue
itself as all migrations left it (leases per claim), and pgmq on its database:

- two_calls: claim(100) + complete_many() on the job table as it was before the migration
  (bench/hot_path_steps.sql);
- one_call: complete_and_claim(): one call and one transaction per batch, and a finished job
  leaves the job table (each done job a row in job_history); still a token per job and the
  old table;
- one_token: + one lock token per call instead of one per job;
- hot_claims: + the claim index without a status predicate, no lease or finished index,
  fillfactor 50: claims are HOT updates;
- done_batches: + done jobs without an idempotency key written one row per call to
  done_batches instead of a row each to job_history: the hot path as migration 20261203000003
  left it;
- flow_control: issue 17's complete_and_claim() (pause, rate limits, concurrency keys,
  results) from the flow-control migration, with no key, limit or pause set, so what it adds
  to the hot path is only its checks for them;
- claims: pgqueue itself, as every migration left it: leases per claim (migration
  20261203000007), where a claim deletes its jobs from the job table into one row of claims
  and completing the batch deletes that row;
- pgmq: read(q, 30, 100) + delete(q, ids), for scale.

The steps from one_call to done_batches run the hot-path migration's own complete_and_claim()
and its job_history and done_batches tables, read from the rendered migration (later
migrations redefine the live function), with the later steps' changes undone by text
substitution (REWRITES): when the migration changes under them, the run fails instead of
measuring something else. flow_control runs the flow-control migration's complete_and_claim()
as that migration wrote it, on its own job table; with nothing set it reads pgqueue's queues
and config, and calls nothing else of pgqueue. flow_control against done_batches, in the same
run, is issue 17's cost target (TARGETS): within 5% of the hot path's server CPU per job and
jobs/s.

Each step drains the same queued no-op jobs with one connection, batch 100, its runs
interleaved with the other steps'. Figures per job: the server backend's CPU time (user +
system, from /proc: the figure a busy machine moves least), the loop process's CPU time, the
WAL written, and jobs/s; then, to show that each step changes what it says, the updates of
the job table per job and the share of them that were HOT, the rows written to history tables
per job, and the distinct lock tokens per claimed job.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from .peers import (
    PGMQ_QUEUE,
    PGMQ_READ,
    PGMQ_VT,
    pgmq_finish,
    pgmq_ids,
    pgmq_reset,
    pgmq_warm_up,
)
from .queue_sql import (
    CLAIM_BATCH,
    backend_cpu_s,
    completion_literals,
    state_tables,
)
from .report import RatioTarget
from .stack import SCHEMA, Stack, render_source, wait_idle_autovacuum

SQL = Path(__file__).with_name("hot_path_steps.sql")
# The development steps between 0.1.0 and 1.0.0 that made the hot path (1.0.0's migration from
# 0.1.0 still applies them): the hot-path step, whose complete_and_claim() and tables the
# scratch steps take, and the flow-control step, whose complete_and_claim() step flow_control
# runs.
HOT_PATH_MIGRATION = "bench/development_steps/03_hot_path.sql.jinja"
FLOW_CONTROL_MIGRATION = "bench/development_steps/04_flow_control.sql.jinja"
# What of pgqueue the flow-control migration's complete_and_claim() may still name on a
# scratch schema: read with nothing set (config, queues), or called only when a queue is
# rate-limited or keyed, or a batch carries results (never in these drains).
FLOW_CONTROL_SHARED = (
    "config", "queues", "claim_allowance", "take_tokens", "keyed_candidates", "running_keys",
    "complete_jobs",
)  # fmt: skip
HISTORY_TABLES = ("job_history", "done_batches")
WORKER = "bench"
WARM_UP = "warm-up"  # a queue nobody enqueues to: the statements are prepared on it


@dataclass(frozen=True)
class Rewrite:
    pattern: str  # a regular expression that matches complete_and_claim()'s body exactly once
    replacement: str


# Changes to the hot-path migration's complete_and_claim(), each undoing one step.
REWRITES = {
    # Undoes done_batches: every done job is a row in job_history, as a done job with an
    # idempotency key is (the `kept` CTE loses its condition, the `batched` CTE goes).
    "history_row_per_job": (
        Rewrite(
            r"\s*where r\.idempotency_key is not null\s*\),\s*batched as \(.*?"
            r"group by r\.queue, r\.kind\s*\)",
            "\n  )",
        ),
    ),
    # Undoes one_token: a fresh token per claimed job, as claim() draws them, and none for
    # the call.
    "token_per_job": (
        Rewrite(r"lock_token = token\b", "lock_token = gen_random_uuid()"),
        Rewrite(r"\n\s*token uuid := gen_random_uuid\(\);", ""),
    ),
}


@dataclass(frozen=True)
class Step:
    name: str
    change: str
    # the blocks of hot_path_steps.sql that make its job table (none: the step is pgqueue
    # itself, or pgmq), and the rewrites of the hot-path migration's complete_and_claim() it
    # gets (two_calls brings its own functions instead)
    blocks: tuple[str, ...] = ()
    rewrites: tuple[str, ...] = ()
    # its tables that keep finished jobs, as the hot-path migration creates them
    history: tuple[str, ...] = ("job_history",)

    @property
    def live(self) -> bool:
        """Runs on pgqueue itself, as all the migrations left it."""
        return self.name == "claims"

    @property
    def schema(self) -> str:
        return SCHEMA if self.live else f"hps_{self.name}"


STEPS = (
    Step(
        "two_calls",
        "claim(100) + complete_many(): two calls and two commits a batch, a token per job, "
        "every column returned, tables as before the migration, done jobs kept in the job table",
        blocks=("jobs_before", "checks_then", "two_calls"),
        history=(),
    ),
    Step(
        "one_call",
        "complete_and_claim(): one call and one commit a batch, the columns a worker needs; "
        "a finished job leaves the job table, a job_history row per done job",
        blocks=("jobs_before", "checks_then"),
        rewrites=("history_row_per_job", "token_per_job"),
    ),
    Step(
        "one_token",
        "+ one lock token per call instead of one per job",
        blocks=("jobs_before", "checks_then"),
        rewrites=("history_row_per_job",),
    ),
    Step(
        "hot_claims",
        "+ claim index without a status predicate, no lease index, fillfactor 50: HOT claims",
        blocks=("hot_table", "checks_then", "jobs_hot"),
        rewrites=("history_row_per_job",),
    ),
    Step(
        "done_batches",
        "+ done jobs without a key a done_batches row per call: the hot path as migration "
        "20261203000003 left it",
        blocks=("hot_table", "checks_then", "jobs_hot"),
        history=HISTORY_TABLES,
    ),
    Step(
        "flow_control",
        "issue 17's complete_and_claim() (pause, rate limits, concurrency keys, results), "
        "no key, limit or pause set",
        blocks=("hot_table", "checks_then", "jobs_flow"),
        history=HISTORY_TABLES,
    ),
    Step(
        "claims",
        "+ leases per claim: a claim moves its jobs into one claims row, completing the batch "
        "deletes it (pgqueue as migrated)",
        history=HISTORY_TABLES,
    ),
    Step("pgmq", "pgmq 1.5.1 read(q, 30, 100) + delete(q, ids)"),
)


def _blocks() -> dict[str, str]:
    parts = re.split(r"^-- block: (\w+)\n", SQL.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@dataclass(frozen=True)
class HotPath:
    """What the steps take from the rendered hot-path migration, in schema pgqueue."""

    complete_and_claim: str  # its create function statement
    tables: dict[str, list[str]]  # HISTORY_TABLES: create table, then create index statements
    flow_control: str  # the flow-control migration's create function complete_and_claim()
    # and its alter table statements of job_history (the columns its function writes)
    flow_control_history: list[str]


def hot_path(project: Path) -> HotPath:
    """The hot-path migration's complete_and_claim() and finished-job tables, from `project`'s
    rendered migrations: later migrations redefine the live function, so pgqueue's own is
    no longer the one to measure."""
    text = render_source(project, HOT_PATH_MIGRATION)
    patterns = {
        "complete_and_claim": COMPLETE_AND_CLAIM,
        **{table: rf"^create table {SCHEMA}\.{table} \(.*?^\)[^;]*;" for table in HISTORY_TABLES},
    }
    statements = {name: _one(text, pattern) for name, pattern in patterns.items()}
    tables = {}
    for table in HISTORY_TABLES:
        indexes = re.findall(
            rf"^create index \w+ on {SCHEMA}\.{table}\b[^;]*;", text, flags=re.MULTILINE
        )
        tables[table] = [statements[table], *indexes]
    flow_text = render_source(project, FLOW_CONTROL_MIGRATION)
    flow_history = re.findall(
        rf"^alter table {SCHEMA}\.job_history\b.*?;", flow_text, flags=re.MULTILINE | re.DOTALL
    )
    if not flow_history:
        raise RuntimeError("the flow-control migration no longer alters job_history")
    return HotPath(
        statements["complete_and_claim"],
        tables,
        _one(flow_text, COMPLETE_AND_CLAIM),
        flow_history,
    )


COMPLETE_AND_CLAIM = rf"^create function {SCHEMA}\.complete_and_claim\(.*?^\$\$;"


def _one(text: str, pattern: str) -> str:
    """The one statement of a migration's `text` that `pattern` matches."""
    matches = re.findall(pattern, text, flags=re.MULTILINE | re.DOTALL)
    if len(matches) != 1:
        raise RuntimeError(
            f"a migration has {len(matches)} statements matching {pattern!r}, not one: the "
            "migration changed; update bench/hot_path_steps.py"
        )
    return matches[0]


def _in_schema(sql: str, step: Step, shared: tuple[str, ...] = ("config",)) -> str:
    """`sql` on `step`'s tables and function instead of pgqueue's; it may use pgqueue's
    `shared` objects (the config, for the lease), nothing else of pgqueue."""
    sql = re.sub(
        rf"\b{SCHEMA}\.(jobs|{'|'.join(HISTORY_TABLES)}|complete_and_claim)\b",
        rf"{step.schema}.\1",
        sql,
    )
    left = set(re.findall(rf"\b{SCHEMA}\.\w+", sql)) - {f"{SCHEMA}.{name}" for name in shared}
    if left:
        raise RuntimeError(
            f"step {step.name}'s SQL from the hot-path migration still uses {sorted(left)}: the "
            "migration changed; update bench/hot_path_steps.py"
        )
    return sql


def _rewrite(definition: str, step: Step) -> str:
    """The hot-path migration's complete_and_claim(), with `step`'s rewrites, on `step`'s
    tables."""
    for name in step.rewrites:
        for rewrite in REWRITES[name]:
            definition, count = re.subn(
                rewrite.pattern, rewrite.replacement, definition, flags=re.DOTALL
            )
            if count != 1:
                raise RuntimeError(
                    f"the migration changed: rewrite {name} ({rewrite.pattern!r}) matched "
                    f"{count} times in the hot-path migration's complete_and_claim(); update "
                    "bench/hot_path_steps.py"
                )
    return _in_schema(definition, step)


def install(stack: Stack) -> None:
    """Create every scratch step's schema: its job table (hot_path_steps.sql), the hot-path
    migration's tables that keep finished jobs, and its functions."""
    blocks = _blocks()
    migrated = hot_path(stack.projects["postgres"])
    with stack.cluster.connect(autocommit=True) as conn:
        for step in STEPS:
            if not step.blocks:
                continue
            conn.execute(f"drop schema if exists {step.schema} cascade")
            conn.execute(f"create schema {step.schema}")
            for block in step.blocks:
                conn.execute(blocks[block].replace("{s}", step.schema))
            for table in step.history:
                for statement in migrated.tables[table]:
                    conn.execute(_in_schema(statement, step))
            if step.name == "flow_control":
                for statement in migrated.flow_control_history:
                    conn.execute(_in_schema(statement, step))
                conn.execute(_in_schema(migrated.flow_control, step, FLOW_CONTROL_SHARED))
            elif step.name != "two_calls":
                conn.execute(_rewrite(migrated.complete_and_claim, step))


@dataclass
class Drained:
    batches: int = 0  # claims that returned jobs
    first_tokens: list = field(default_factory=list)  # the lock tokens of the first batch


class TwoCalls:
    def __init__(self, schema: str) -> None:
        self.claim = f"select id, lock_token::text from {schema}.claim(%s, %s, null, %s)"
        self.complete = f"select count(*) from {schema}.complete_many(%s::bigint[], %s::uuid[])"

    def warm_up(self, conn: psycopg.Connection) -> None:
        conn.execute(self.claim, (WORKER, CLAIM_BATCH, WARM_UP), prepare=True).fetchall()
        conn.execute(self.complete, ("{}", "{}"), prepare=True).fetchone()

    def drain(self, conn: psycopg.Connection) -> Drained:
        drained = Drained()
        while True:
            rows = conn.execute(self.claim, (WORKER, CLAIM_BATCH, "default"), prepare=True)
            rows = rows.fetchall()
            if not rows:
                return drained
            drained.batches += 1
            drained.first_tokens = drained.first_tokens or [r[1] for r in rows]
            conn.execute(self.complete, completion_literals(rows), prepare=True).fetchone()


class CompleteAndClaim:
    """Each call completes the batch the previous one claimed; the call that finds the queue
    empty completes the last batch."""

    def __init__(self, schema: str) -> None:
        self.call = (
            f"select id, lock_token::text from {schema}.complete_and_claim("
            "%s, %s::bigint[], %s::uuid[], %s, null, %s)"
        )

    def warm_up(self, conn: psycopg.Connection) -> None:
        conn.execute(self.call, (WORKER, "{}", "{}", CLAIM_BATCH, WARM_UP), prepare=True).fetchall()

    def drain(self, conn: psycopg.Connection) -> Drained:
        drained = Drained()
        ids, tokens = "{}", "{}"
        while True:
            rows = conn.execute(
                self.call, (WORKER, ids, tokens, CLAIM_BATCH, "default"), prepare=True
            ).fetchall()
            if not rows:
                return drained
            ids, tokens = completion_literals(rows)
            drained.batches += 1
            drained.first_tokens = drained.first_tokens or [r[1] for r in rows]


class Pgmq:
    delete = pgmq_finish("delete")

    def warm_up(self, conn: psycopg.Connection) -> None:
        pgmq_warm_up(conn)

    def drain(self, conn: psycopg.Connection) -> Drained:
        drained = Drained()
        while True:
            rows = conn.execute(
                PGMQ_READ, (PGMQ_QUEUE, PGMQ_VT, CLAIM_BATCH), prepare=True
            ).fetchall()
            if not rows:
                return drained
            drained.batches += 1
            conn.execute(self.delete, (PGMQ_QUEUE, pgmq_ids(rows)), prepare=True).fetchone()


def _table_counts(conn: psycopg.Connection, tables: list[str]) -> dict[str, tuple[int, ...]]:
    """Rows inserted, updated, HOT-updated into each of `tables` so far, this connection's
    included (pg_stat_force_next_flush: its counts reach the statistics when it goes idle)."""
    conn.execute("select pg_stat_force_next_flush()")
    return {
        table: conn.execute(
            "select n_tup_ins, n_tup_upd, n_tup_hot_upd from pg_stat_user_tables "
            "where relid = %s::regclass",
            (table,),
        ).fetchone()
        for table in tables
    }


def _fill(stack: Stack, conn: psycopg.Connection, step: Step, jobs: int) -> None:
    """The step's tables empty and vacuumed (pgqueue's: with no pause or limit either), then
    `jobs` queued no-op jobs."""
    if step.name == "pgmq":
        pgmq_reset(stack, queued=jobs)
        return
    s = step.schema
    if step.live:
        tables = ", ".join(state_tables(conn))
    else:
        tables = ", ".join(f"{s}.{t}" for t in ("jobs", *step.history))
    conn.execute(f"truncate {tables}")
    conn.execute(
        f"insert into {s}.jobs (kind, payload) "
        "select 'noop', jsonb_build_object('n', n) from generate_series(1, %s) as n",
        (jobs,),
    )
    conn.execute(f"vacuum analyze {tables}")


# The done jobs each history table keeps.
DONE_KEPT = {
    "job_history": "select count(*) from {s}.job_history where status = 'done'",
    "done_batches": "select coalesce(sum(cardinality(ids)), 0) from {s}.done_batches",
}


def _check(conn: psycopg.Connection, step: Step, jobs: int) -> None:
    """Every job finished as the step keeps it: done in the job table (two_calls), in the
    history (the other steps), deleted (pgmq)."""
    s = step.schema
    if step.name == "pgmq":
        left, kept = conn.execute(f"select count(*), 0 from pgmq.q_{PGMQ_QUEUE}").fetchone()
    elif step.name == "two_calls":
        left, kept = conn.execute(
            f"select count(*) filter (where status <> 'done'), "
            f"count(*) filter (where status = 'done') from {s}.jobs"
        ).fetchone()
    else:
        left = conn.execute(f"select count(*) from {s}.jobs").fetchone()[0]
        kept = sum(
            conn.execute(DONE_KEPT[table].format(s=s)).fetchone()[0] for table in step.history
        )
    if left or kept != (0 if step.name == "pgmq" else jobs):
        raise RuntimeError(f"{step.name}: {left} of {jobs} jobs not finished, {kept} kept as done")


def measure(stack: Stack, step: Step, jobs: int) -> dict[str, float]:
    """One drain of `jobs` jobs through `step`, on a new connection."""
    driver: TwoCalls | CompleteAndClaim | Pgmq
    if step.name == "pgmq":
        driver, dbname = Pgmq(), "pgmq"
        job_table, history = f"pgmq.q_{PGMQ_QUEUE}", [f"pgmq.a_{PGMQ_QUEUE}"]
    else:
        two_calls = step.name == "two_calls"
        driver = TwoCalls(step.schema) if two_calls else CompleteAndClaim(step.schema)
        dbname, job_table = "postgres", f"{step.schema}.jobs"
        history = [f"{step.schema}.{table}" for table in step.history]
    with stack.cluster.connect(dbname, autocommit=True) as conn:
        _fill(stack, conn, step, jobs)
        driver.warm_up(conn)
        wait_idle_autovacuum(stack)
        pid = conn.execute("select pg_backend_pid()").fetchone()[0]
        before = _table_counts(conn, [job_table, *history])
        lsn = conn.execute("select pg_current_wal_lsn()").fetchone()[0]

        server = backend_cpu_s(pid)
        client = time.process_time()
        started = time.perf_counter()
        drained = driver.drain(conn)
        elapsed = time.perf_counter() - started
        client = time.process_time() - client
        server = backend_cpu_s(pid) - server

        wal = conn.execute("select pg_current_wal_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0]
        after = _table_counts(conn, [job_table, *history])
        _check(conn, step, jobs)
    if drained.batches != -(-jobs // CLAIM_BATCH):
        raise RuntimeError(f"{step.name}: {drained.batches} batches for {jobs} jobs")
    updates, hot = (after[job_table][i] - before[job_table][i] for i in (1, 2))
    figures = {
        "server_cpu_us_per_job": server / jobs * 1e6,
        "client_cpu_us_per_job": client / jobs * 1e6,
        "wal_bytes_per_job": float(wal) / jobs,
        "jobs_per_s": jobs / elapsed,
        "updates_per_job": updates / jobs,
        "hot_update_share": hot / updates if updates else 0.0,
        "history_rows_per_job": sum(after[t][0] - before[t][0] for t in history) / jobs,
    }
    if drained.first_tokens:
        figures["tokens_per_job"] = len(set(drained.first_tokens)) / len(drained.first_tokens)
    return figures


def run(stack: Stack, jobs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Every step `repeats` times, interleaved (the order reversed every other round)."""
    install(stack)
    out: dict[str, dict[str, list[float]]] = {}
    for repeat in range(repeats):
        for step in STEPS if repeat % 2 == 0 else reversed(STEPS):
            for figure, value in measure(stack, step, jobs).items():
                out.setdefault(step.name, {}).setdefault(figure, []).append(value)
    return out


# The figures compared with pgmq's, as (figure, column heading); then those that show what
# each step changed.
COMPARED = (
    ("server_cpu_us_per_job", "server us/job"),
    ("client_cpu_us_per_job", "client us/job"),
    ("wal_bytes_per_job", "WAL B/job"),
    ("jobs_per_s", "jobs/s"),
)
CHECKS = (
    ("updates_per_job", "updates/job"),
    ("hot_update_share", "HOT share"),
    ("history_rows_per_job", "history rows/job"),
    ("tokens_per_job", "tokens/job"),
)

# Issue 17's cost: claims with no keys and no limits stay within 5% of the hot path's
# throughput, in the same run. Server CPU per job is the figure a busy machine moves least.
# (flow_control is the flow-control migration's hot path, as issue 17 left it.)
TARGETS = (
    RatioTarget("flow_control", "server_cpu_us_per_job", over="done_batches", maximum=1.05),
    RatioTarget("flow_control", "jobs_per_s", 0.95, over="done_batches"),
)


def add_pgmq_ratios(summary: dict[str, Any]) -> None:
    """Each compared figure's median over pgmq's, as `vs_pgmq`."""
    pgmq = summary.get("pgmq", {})
    for figures in summary.values():
        for figure, _ in COMPARED:
            theirs = pgmq.get(figure, {}).get("median")
            if figure in figures and theirs:
                figures[figure]["vs_pgmq"] = round(figures[figure]["median"] / theirs, 2)


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def table(summary: dict[str, Any]) -> str:
    """Medians, each compared figure with its ratio to pgmq's (lower is better but for jobs/s)."""
    header = ["step"]
    for _, heading in COMPARED:
        header += [heading, "x pgmq"]
    header += [heading for _, heading in CHECKS]
    rows = [header]
    for step in STEPS:
        figures = summary.get(step.name)
        if figures is None:
            continue
        row = [step.name]
        for figure, _ in COMPARED:
            s = figures[figure]
            row += [_number(s["median"]), f"{s['vs_pgmq']:.2f}x" if "vs_pgmq" in s else ""]
        row += [_number(figures[f]["median"]) if f in figures else "" for f, _ in CHECKS]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    n = {len(s["jobs_per_s"]["values"]) for s in summary.values() if "jobs_per_s" in s}
    lines.append(f"(medians of {', '.join(map(str, sorted(n)))} runs; steps:)")
    lines += [f"  {step.name}: {step.change}" for step in STEPS]
    return "\n".join(lines)
