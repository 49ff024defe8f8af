"""Our workflows (issue 51) driven from SQL, beside pgflow's (bench/workflow_peers.py, whose
docstring says what makes the two sides comparable).

Two shapes, each run one enqueue_many() call (one transaction) with `depends_on_index`:
- `chain`: `a`, then `b` depending on it, then `c` depending on `b`: 3 jobs a run;
- `fanin`: FANIN_CHILDREN `child` jobs, then `fanin`, depending on all of them: 101 jobs a
  run.

A scenario enqueues `runs` runs (timed apart: start_runs_per_s), then `processes` processes
drain them, a connection each, as our workers drive the queue: complete_and_claim() in a loop,
each call completing the batch the previous one claimed (CLAIM_BATCH, as queue_sql's hot loop)
with OUTPUT as every job's result (done_results), and claiming the next. A dependent job's
payload must hold, under `_dependencies`, each of its dependencies done with OUTPUT as its
result (checked as it is claimed). A call that claims nothing ends the process when nothing is
queued, waiting or claimed by another process any more; otherwise it polls again after POLL_S
(where a worker would be woken).
Each process warms up on a 2-job chain in a queue of its own before the go. Figures, named as
pgflow's: steps_per_s (jobs completed a second, from the go to the last completion, the fan-in
job included), runs_per_s, start_runs_per_s, server_cpu_us_per_step (the drain's backends'
CPU time over its jobs) and start_server_cpu_us_per_run. Afterwards every job enqueued must be
in the history done, at its first attempt, with OUTPUT, nothing queued, waiting or claimed, and
each dependent must have been given exactly its own dependencies (check()), or the scenario
fails.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from multiprocessing.synchronize import Event as EventType

import psycopg

from .queue_sql import (
    CLAIM_BATCH,
    SINGLE_WARM_UP,
    array_literal,
    backend_cpu_s,
    completion_literals,
    reset,
)
from .stack import SCHEMA, Stack
from .workflow_peers import FANIN_CHILDREN, OUTPUT, drive, figures

S = SCHEMA
QUEUE = "default"
POLL_S = 0.005  # a process that found nothing while jobs still wait asks again this soon

# complete_and_claim(worker, done_ids, done_tokens, max_jobs, kinds, queue, lease_seconds,
# done_results), the ids, tokens and results sent as array literals (queue_sql.array_literal)
CALL = (
    f"select id, lock_token::text, kind, payload from {S}.complete_and_claim("
    "%s, %s::bigint[], %s::uuid[], %s, null, %s, null, %s::jsonb[])"
)
ENQUEUE = (
    f"select array_agg(x order by n) from {S}.enqueue_many(%s::jsonb) with ordinality as t(x, n)"
)
# (a job another process holds may release more when it completes)
MORE_TO_COME = (
    f"select exists (select from {S}.waiting_jobs) "
    f"or exists (select from {S}.jobs as j where j.queue = %(q)s) "
    f"or exists (select from {S}.claims as c where c.queue = %(q)s)"
)
# OUTPUT as an element of a jsonb[] literal: quoted, its quotes and backslashes escaped
_RESULT = '"' + OUTPUT.replace("\\", "\\\\").replace('"', '\\"') + '"'
_OUTPUT = json.loads(OUTPUT)


def run_jobs(shape: str, queue: str = QUEUE) -> list[dict]:
    """The elements of the enqueue_many() call that enqueues a run of `shape`."""
    if shape == "chain":
        return [
            {"kind": "a", "queue": queue, "payload": {"n": 1}},
            {"kind": "b", "queue": queue, "depends_on_index": [0]},
            {"kind": "c", "queue": queue, "depends_on_index": [1]},
        ]
    children = [
        {"kind": "child", "queue": queue, "payload": {"item": i}} for i in range(FANIN_CHILDREN)
    ]
    return [
        *children,
        {"kind": "fanin", "queue": queue, "depends_on_index": list(range(FANIN_CHILDREN))},
    ]


# Each dependent kind: the kind of its dependencies, and how many it has.
DEPENDS = {"b": ("a", 1), "c": ("b", 1), "fanin": ("child", FANIN_CHILDREN)}
JOBS_PER_RUN = {"chain": 3, "fanin": FANIN_CHILDREN + 1}


def expected_dependencies(shape: str, ids: list[int]) -> dict[int, list[int]]:
    """Each dependent job of a run (its enqueued `ids`, in element order): its dependencies."""
    if shape == "chain":
        return {ids[1]: [ids[0]], ids[2]: [ids[1]]}
    return {ids[-1]: ids[:-1]}


def start_runs(conn: psycopg.Connection, shape: str, runs: int) -> list[list[int]]:
    """`runs` runs of `shape`, one enqueue_many() call (and transaction) each: their job ids."""
    jobs = json.dumps(run_jobs(shape))
    return [conn.execute(ENQUEUE, (jobs,), prepare=True).fetchone()[0] for _ in range(runs)]


def results_literal(count: int) -> str:
    """A jsonb[] literal of `count` OUTPUTs: every job's result."""
    return "{" + ",".join([_RESULT] * count) + "}"


def dependencies_of(row: tuple) -> tuple[int, list[int]] | None:
    """For a claimed dependent job (id, token, kind, payload): its id and the ids of the
    dependencies its payload lists, each checked done, of the right kind, with OUTPUT as its
    result. None for a job that depends on nothing."""
    job_id, _, kind, payload = row
    if kind not in DEPENDS:
        return None
    want_kind, count = DEPENDS[kind]
    given = payload.get("_dependencies") or {}
    wrong = [
        key
        for key, dep in given.items()
        if dep != {"kind": want_kind, "status": "done", "result": _OUTPUT}
    ]
    if len(given) != count or wrong:
        raise RuntimeError(
            f"job {job_id} ({kind}) was given {len(given)} dependencies of {count}, "
            f"{len(wrong)} not done with the output: {dict(list(given.items())[:3])}"
        )
    return job_id, sorted(int(key) for key in given)


class Drainer:
    """One connection's complete_and_claim() loop: `step()` completes the batch it claimed
    before with OUTPUT and claims the next, checking each dependent it claims."""

    def __init__(self, conn: psycopg.Connection, name: str, queue: str = QUEUE) -> None:
        self.conn, self.name, self.queue = conn, name, queue
        self.pid = conn.info.backend_pid
        self.rows: list[tuple] = []
        self.done = 0
        self.given: list[tuple[int, list[int]]] = []  # (dependent, the dependencies it got)
        self.began_cpu_s = backend_cpu_s(self.pid)
        self.last, self.cpu_s = time.perf_counter(), self.began_cpu_s

    def step(self) -> int:
        """One call: the jobs it claimed. A call that completed jobs sets `last` (when it
        returned) and `cpu_s` (the backend's CPU time then)."""
        completing = len(self.rows)
        ids, tokens = completion_literals([(r[0], r[1]) for r in self.rows])
        params = (self.name, ids, tokens, CLAIM_BATCH, self.queue, results_literal(completing))
        claimed = self.conn.execute(CALL, params, prepare=True).fetchall()
        if completing:
            self.done += completing
            self.last, self.cpu_s = time.perf_counter(), backend_cpu_s(self.pid)
        self.rows = claimed
        for row in claimed:
            if (given := dependencies_of(row)) is not None:
                self.given.append(given)
        return len(claimed)

    def drain(self) -> None:
        """Steps until a call claims nothing and nothing is queued, waiting or held by another
        process any more."""
        while True:
            if self.step():
                continue
            more = self.conn.execute(MORE_TO_COME, {"q": self.queue}, prepare=True).fetchone()[0]
            if not more:
                return
            time.sleep(POLL_S)


def _warm_up(conn: psycopg.Connection, name: str) -> None:
    """The loop warmed up on a 2-job chain in a queue of its own: statements prepared, the
    plans of the claim, of a completion that releases a dependent and of one that does not,
    cached."""
    queue = f"{SINGLE_WARM_UP}-{name}"
    jobs = run_jobs("chain", queue)[:2]
    conn.execute(ENQUEUE, (json.dumps(jobs),), prepare=True)
    drainer = Drainer(conn, name, queue)
    drainer.drain()
    if drainer.done != 2 or len(drainer.given) != 1:
        raise RuntimeError(f"the warm-up completed {drainer.done} jobs, not 2")


def _drain_loop(
    dsn: str, name: str, ready: multiprocessing.Queue, go: EventType, out: multiprocessing.Queue
) -> None:
    """A drain process: warms up, says it is ready, waits for the go, drains. Puts (jobs
    completed, when its last batch was done, its backend's CPU seconds up to then, the
    dependencies each dependent it claimed was given)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _warm_up(conn, name)
        ready.put(conn.info.backend_pid)
        go.wait()
        drainer = Drainer(conn, name)
        drainer.drain()
        # (up to its last completion: the polls after it are not counted, as pgflow's are not)
        cpu = drainer.cpu_s - drainer.began_cpu_s
        out.put((drainer.done, drainer.last, cpu, drainer.given))


def drain(stack: Stack, shape: str, runs: int, processes: int) -> dict[str, float]:
    """`runs` runs of `shape` ("chain" or "fanin") enqueued, then drained by `processes`
    processes; checked afterwards (check())."""
    reset(stack)
    drained = drive(
        stack.dsn(),
        _drain_loop,
        [f"bench-{i}" for i in range(processes)],
        lambda conn: start_runs(conn, shape, runs),
    )
    steps = sum(done for done, _, _, _ in drained.results)
    given = dict(pair for *_, pairs in drained.results for pair in pairs)
    check(stack, shape, drained.runs, given, steps)
    return figures(drained, runs)


def check(
    stack: Stack, shape: str, ids: list[list[int]], given: dict[int, list[int]], steps: int
) -> None:
    """Every job of the runs `ids` completed once (`steps` completions in all), in the history
    done at its first attempt with OUTPUT; nothing left queued, waiting or claimed; and each
    dependent given (`given`, by the drains) exactly its own dependencies."""
    every = [job for run in ids for job in run]
    with stack.cluster.connect() as conn:
        done = conn.execute(
            f"select count(*), count(*) filter (where h.status = 'done' and h.attempts = 1 "
            f"and h.result = %s::jsonb) from {S}.job_history as h where h.id = any (%s)",
            (OUTPUT, array_literal(every)),
        ).fetchone()
        left = conn.execute(
            f"select (select count(*) from {S}.jobs where queue = %(q)s), "
            f"(select count(*) from {S}.waiting_jobs), "
            f"(select count(*) from {S}.claims where queue = %(q)s)",
            {"q": QUEUE},
        ).fetchone()
    if done != (len(every), len(every)) or steps != len(every) or left != (0, 0, 0):
        raise RuntimeError(
            f"workflow {shape}: {done[1]} of {len(every)} jobs done once ({done[0]} in the "
            f"history, {steps} completions); "
            f"left queued, waiting, claimed: {left}"
        )
    check_dependencies(shape, ids, given)


def check_dependencies(shape: str, ids: list[list[int]], given: dict[int, list[int]]) -> None:
    """Each dependent of the runs `ids` was given (`given`: the dependencies listed in its
    payload, by the drains) its own dependencies, and only they."""
    expected = {
        dependent: deps
        for run in ids
        for dependent, deps in expected_dependencies(shape, run).items()
    }
    if given != expected:
        missing = sorted(set(expected) - set(given))[:5]
        differ = [job for job in expected if job in given and given[job] != expected[job]][:5]
        raise RuntimeError(
            f"workflow {shape}: {len(given)} of {len(expected)} dependents were given their "
            f"dependencies; never claimed: {missing}; given others: {differ}"
        )
