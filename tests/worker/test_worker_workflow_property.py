"""Random workflows with random failures, run by 4 real worker processes of a rendered project
(style python, transport postgres), issue 51's property test: seeded random DAGs (8
workflows of 5 to 30 steps, each step after 1 to 3 earlier ones, some with
on_dependency_failure 'run'), each enqueued in one enqueue_many() call; about 15% of the
steps fail for good (dead-lettered, after a retry for some) and about 15% fail once and then
succeed. Each attempt is recorded by the e2e_dag handler (tests/support/handlers/e2e_dag.py)
with its worker's pid, its times and what job.dependencies handed it. Shown, from those
records and job(id) / workflow(): no step started before each of its dependencies had ended,
none succeeded twice, none ran more attempts than it had, each ended as its dependencies'
outcomes say (cancelled naming a failed or cancelled dependency, under 'cancel'), and none is
left waiting. In two cases a worker is killed (SIGKILL) while it runs a step: its jobs come
back after their lease, rescued as the sweeper rescues them, and still none is left waiting
or runs early.

The test stack's pg_cron sweeper is paused, and the rescue here is _rescue_expired() alone:
sweep()'s safety net (which releases waiting jobs whose dependencies all finished) would hide
a release the completions missed."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from testkit.project import variant
from tests.support.jobs import wait_until
from tests.support.workers import HANDLERS, Installed, Workers, with_handlers

NODE = HANDLERS / "e2e_dag.py"
WORKFLOWS = 8
FINISHED = ("done", "failed", "cancelled")
# seconds the killed worker's step sleeps on its first attempt: it is killed meanwhile
SLEEPER = 2.5
# the workers' lease in the case that kills one: how soon its jobs come back
LEASE = 4
CASES = (
    "dead-lettered",
    "retried, then done",
    "cancelled",
    "cancelled transitively",
    "run, told of a failure",
    "run, told of a cancellation",
    "after 2 or more",
)


@dataclass
class Step:
    workflow: int
    index: int
    after: list[int]  # indexes of earlier steps of its workflow
    run: bool  # on_dependency_failure 'run'
    fail_attempts: int  # its first attempts that raise
    max_attempts: int
    sleep_first: float = 0

    @property
    def name(self) -> str:
        return f"w{self.workflow}s{self.index}"

    @property
    def fails(self) -> bool:
        return self.fail_attempts >= self.max_attempts


def random_workflows(seed: int) -> list[list[Step]]:
    rng = random.Random(seed)
    workflows = []
    for w in range(WORKFLOWS):
        steps = []
        for i in range(rng.randint(5, 30)):
            after = sorted(rng.sample(range(i), k=min(i, rng.choice([1, 1, 2, 3]))))
            roll = rng.random()
            if roll < 0.15:  # dead-lettered: at once, or after a retry
                fail_attempts, max_attempts = 99, rng.choice([1, 2])
            elif roll < 0.30:  # a retry, then done (one attempt to spare for a lost lease)
                fail_attempts, max_attempts = 1, 3
            else:
                fail_attempts, max_attempts = 0, 2
            steps.append(Step(w, i, after, rng.random() < 0.25, fail_attempts, max_attempts))
        workflows.append(steps)
    return workflows


def expected_statuses(steps: list[Step]) -> list[str]:
    """What each step of a workflow must end as: cancelled when a dependency did not end done
    (unless it runs anyway), else failed or done as its own attempts go."""
    ends: list[str] = []
    for step in steps:
        broken = any(ends[d] != "done" for d in step.after)
        ends.append("cancelled" if broken and not step.run else "failed" if step.fails else "done")
    return ends


def situations(workflows: list[list[Step]]) -> Counter[str]:
    """How many steps of the workflows meet each case the test is about."""
    seen: Counter[str] = Counter()
    for steps in workflows:
        ends = expected_statuses(steps)
        for step, end in zip(steps, ends, strict=True):
            broken = any(ends[d] != "done" for d in step.after)
            seen["dead-lettered"] += end == "failed"
            seen["retried, then done"] += end == "done" and step.fail_attempts > 0
            seen["cancelled"] += end == "cancelled"
            seen["cancelled transitively"] += end == "cancelled" and any(
                ends[d] == "cancelled" for d in step.after
            )
            seen["run, told of a failure"] += step.run and broken
            seen["run, told of a cancellation"] += step.run and any(
                ends[d] == "cancelled" for d in step.after
            )
            seen["after 2 or more"] += len(step.after) > 1
    return seen


def enqueue(db: psycopg.Connection, steps: list[Step], log: Path) -> list[int]:
    """The workflow's job ids, enqueued in one enqueue_many() call."""
    jobs = [
        {
            "kind": "e2e_dag",
            "payload": {
                "log": str(log),
                "name": step.name,
                "fail_attempts": step.fail_attempts,
                "sleep_first": step.sleep_first,
            },
            "max_attempts": step.max_attempts,
            **({"depends_on_index": step.after} if step.after else {}),
            **({"on_dependency_failure": "run"} if step.run else {}),
        }
        for step in steps
    ]
    rows = db.execute("select * from pgqueue.enqueue_many(%s)", (Jsonb(jobs),)).fetchall()
    return [row[0] for row in rows]


def final_jobs(db: psycopg.Connection, ids: list[int]) -> dict[int, dict]:
    with db.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "select j.* from unnest(%s::bigint[]) as x(id), lateral pgqueue.job(x.id) as j",
            (ids,),
        ).fetchall()
    return {row["id"]: row for row in rows}


def records(log: Path) -> dict[int, list[dict]]:
    """Each job's recorded attempts' lines (start, end, fail), in the order written."""
    by_job: dict[int, list[dict]] = defaultdict(list)
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        by_job[record["job_id"]].append(record)
    return by_job


@pytest.fixture
def paused_sweeper(db: psycopg.Connection) -> Iterator[None]:
    """The test stack pauses the pg_cron sweeper: checked, since its safety net would release
    what a completion failed to."""
    (active,) = db.execute(
        "select bool_or(active) from cron.job where jobname = 'pgqueue-sweep'"
    ).fetchone()
    assert active is False, "the test stack's sweeper should be paused"
    yield


def until_finished(
    db: psycopg.Connection, ids: list[int], names: dict[int, str], seed: int, rescue: bool
) -> None:
    """Until no job of `ids` is queued, running or waiting (rescuing expired leases meanwhile
    when asked, as the sweeper would), else fail listing what is left."""
    deadline = time.monotonic() + 60
    while True:
        left = db.execute(
            "select j.id, j.status, j.attempts, j.depends_on"
            " from unnest(%s::bigint[]) as x(id), lateral pgqueue.job(x.id) as j"
            " where j.status not in ('done', 'failed', 'cancelled') order by j.id",
            (ids,),
        ).fetchall()
        if not left:
            return
        if time.monotonic() > deadline:
            shown = "\n".join(
                f"  {names[i]} (job {i}): {status}, {attempts} attempts, waits on"
                f" {[(names.get(d['id'], d['id']), d['status']) for d in depends_on or []]}"
                for i, status, attempts, depends_on in left
            )
            pytest.fail(f"seed {seed}: after 60 s, {len(left)} jobs are not finished:\n{shown}")
        if rescue:
            db.execute("select * from pgqueue._rescue_expired()")
        time.sleep(0.2)


def kill_the_sleepers_worker(workers: Workers, log: Path, sleeper: str) -> int:
    """SIGKILL the worker whose process started `sleeper` (while it sleeps); its pid."""

    def started() -> int | None:
        pids = [
            r["pid"]
            for lines in records(log).values()
            for r in lines
            if r["name"] == sleeper and r["at"] == "start"
        ]
        return pids[0] if pids else None

    pid = wait_until(started, timeout=30, what=f"{sleeper} to start")
    [worker] = [w for w in workers.started if w.proc.pid == pid]
    worker.kill()
    return pid


def check_step(
    step: Step,
    ids: list[int],
    expected: str,
    final: dict[int, dict],
    runs: dict[int, list[dict]],
    killed: int | None,
) -> list[str]:
    """What is wrong with one step's end and records (nothing: [])."""
    job = final[ids[step.index]]
    lines = runs.get(job["id"], [])
    problems: list[str] = []
    if job["status"] != expected:
        problems.append(f"ended {job['status']} ({first_line(job['last_error'])}), not {expected}")
    # never run early: each attempt started after every record of each dependency
    for d in step.after:
        last = max((r["t"] for r in runs.get(ids[d], [])), default=None)
        early = [r["attempt"] for r in lines if r["at"] == "start" and last and r["t"] < last]
        if early:
            problems.append(f"attempts {early} started before w{step.workflow}s{d} had ended")
    for record in lines:
        if record["at"] != "start":
            problems += check_handed(step, ids, final, record)
    problems += check_attempts(step, job, lines, killed)
    if job["status"] == "cancelled":
        problems += check_cancelled(step, job, ids, final, bool(lines))
    return problems


def check_handed(step: Step, ids: list[int], final: dict[int, dict], record: dict) -> list[str]:
    """An attempt was handed each dependency as it ended (under 'cancel', all of them done),
    a done one with its result and no error, the others with their error."""
    problems = []
    attempt = f"attempt {record['attempt']}"
    wanted = {str(ids[d]): final[ids[d]]["status"] for d in step.after}
    given = {i: d["status"] for i, d in record["dependencies"].items()}
    if given != wanted or (not step.run and set(given.values()) - {"done"}):
        problems.append(f"{attempt} was handed {given}, not {wanted}")
    for d in step.after:
        name, handed = (
            f"w{step.workflow}s{d} (job {ids[d]})",
            record["dependencies"].get(str(ids[d])),
        )
        if handed is None:
            continue
        # a done one comes with no error, though it kept its failed attempt's in the history
        if handed["status"] == "done" and (handed["result"] != name.split()[0] or handed["error"]):
            problems.append(
                f"{attempt} was handed {name}, which is done, with result {handed['result']!r}"
                f" and error {first_line(handed['error'])!r} (wanted its name and no error)"
            )
        told = first_line(final[ids[d]]["last_error"])
        if handed["status"] != "done" and first_line(handed["error"]) != told:
            problems.append(
                f"{attempt} was handed {name}'s error {handed['error']!r}, not {told!r}"
            )
    return problems


def check_attempts(step: Step, job: dict, lines: list[dict], killed: int | None) -> list[str]:
    """A done step succeeded once (twice when the killed worker's success was never
    completed), another never; none ran more attempts than it had, nor (with no worker killed)
    other than its failures say."""
    problems = []
    starts = [r for r in lines if r["at"] == "start"]
    ends = [r for r in lines if r["at"] == "end"]
    successes = len(ends) == 1 or (
        killed is not None and len(ends) == 2 and ends[0]["pid"] == killed != ends[1]["pid"]
    )
    if (job["status"] == "done" and not successes) or (job["status"] != "done" and ends):
        problems.append(f"succeeded {len(ends)}x: {ends}")
    most = job["max_attempts"]
    if len(starts) > most or job["attempts"] > most:
        problems.append(f"ran {len(starts)} attempts ({job['attempts']} counted) of {most}")
    if killed is None and job["status"] in ("done", "failed"):
        tried = step.fail_attempts + 1 if job["status"] == "done" else most
        if len(starts) != tried:
            problems.append(f"ran {len(starts)} attempts, not {tried}")
    return problems


def first_line(error: str | None) -> str | None:
    """An error without its traceback."""
    return error.splitlines()[0] if error else error


def check_cancelled(
    step: Step, job: dict, ids: list[int], final: dict[int, dict], ran: bool
) -> list[str]:
    """A cancelled step never ran, and its reason names a dependency that failed (so) or was
    cancelled."""
    reason = re.fullmatch(
        r"dependency (\d+) was (dead-lettered|cancelled)\b.*", job["last_error"], re.DOTALL
    )
    blamed = final.get(int(reason[1])) if reason else None
    said = {"dead-lettered": "failed", "cancelled": "cancelled"}.get(reason[2]) if reason else None
    problems = ["ran, though cancelled"] if ran else []
    why = first_line(job["last_error"])
    if blamed is None or blamed["id"] not in [ids[d] for d in step.after]:
        problems.append(f"cancelled for {why!r}: not one of its dependencies")
    elif blamed["status"] != said:
        problems.append(f"cancelled for {why!r}, but it is {blamed['status']}")
    return problems


def check_workflow(db: psycopg.Connection, steps: list[Step], ids: list[int]) -> list[str]:
    """workflow(root) lists every step, each with its dependencies, none waiting."""
    drawn = {
        row[0]: (row[1], row[2])
        for row in db.execute(
            "select id, status, depends_on from pgqueue.workflow(%s)", (ids[0],)
        ).fetchall()
    }
    wanted = {ids[s.index]: sorted(ids[d] for d in s.after) for s in steps}
    if {i: depends_on for i, (_, depends_on) in drawn.items()} != wanted:
        return [f"workflow({ids[0]}) draws {drawn}, not {wanted}"]
    if any(status not in FINISHED for status, _ in drawn.values()):
        return [f"workflow({ids[0]}) has unfinished steps: {drawn}"]
    return []


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
@pytest.mark.parametrize(
    ("seed", "kill"), [(1, False), (2, True), (3, True)], ids=["1", "2-kill", "3-kill"]
)
def test_random_workflows_with_random_failures_under_4_worker_processes(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    paused_sweeper: None,
    tmp_path: Path,
    seed: int,
    kill: bool,
) -> None:
    workflows = random_workflows(seed)
    # (each seed meets every case: else the test would not show what it says)
    cases = situations(workflows)
    assert all(cases[case] for case in CASES), f"seed {seed} meets too few cases: {cases}"
    if kill:
        workflows[0][0].sleep_first = SLEEPER  # (a step that succeeds: 0 of 2 attempts fail)
        workflows[0][0].fail_attempts, workflows[0][0].max_attempts = 0, 2
    src = with_handlers(installed.src, tmp_path / "src", NODE)
    settings = {"WORKER_LEASE_SECONDS": LEASE} if kill else {}
    started = [workers.start(ready=False, src=src, **settings) for _ in range(4)]
    for worker in started:
        worker.wait_ready()
    log = tmp_path / "runs.jsonl"
    ids = [enqueue(db, steps, log) for steps in workflows]
    every = [job_id for workflow_ids in ids for job_id in workflow_ids]
    names = {ids[s.workflow][s.index]: s.name for steps in workflows for s in steps}
    killed = kill_the_sleepers_worker(workers, log, workflows[0][0].name) if kill else None

    until_finished(db, every, names, seed, rescue=kill)
    final, runs = final_jobs(db, every), records(log)
    problems = []
    for steps, workflow_ids in zip(workflows, ids, strict=True):
        for step, expected in zip(steps, expected_statuses(steps), strict=True):
            problems += [
                f"{step.name} (job {workflow_ids[step.index]}, after {step.after},"
                f" {'run' if step.run else 'cancel'}): {problem}"
                for problem in check_step(step, workflow_ids, expected, final, runs, killed)
            ]
        problems += check_workflow(db, steps, workflow_ids)
    (waiting,) = db.execute("select count(*) from pgqueue.waiting_jobs").fetchone()
    if waiting:
        problems.append(f"{waiting} rows left in waiting_jobs")
    if kill:  # the killed worker's step came back after its lease and ran again, once
        sleeper = final[ids[0][0]]
        ran = [(r["pid"] == killed, r["at"]) for r in runs[sleeper["id"]]]
        if ran != [(True, "start"), (False, "start"), (False, "end")]:
            problems.append(f"the killed worker's step ran as (by it?, at) {ran}")
        if [error["type"] for error in sleeper["errors"]] != ["LeaseExpired"]:
            problems.append(f"the killed worker's step has errors {sleeper['errors']}")
    assert not problems, f"seed {seed}{' (a worker killed)' if kill else ''}:\n" + "\n".join(
        problems
    )
