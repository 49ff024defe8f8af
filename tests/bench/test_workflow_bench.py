"""Our side of the workflow benchmark (bench/workflows.py), beside pgflow's
(test_pgflow_peer.py): a drain by 4 processes runs every job of every run once, each only
after its dependencies (the fan-in after its last child), each dependent given its own
dependencies' results; so the steps/s the scenarios print count completed work. A dependent
given the wrong dependencies, and a drain that leaves work undone, fail."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import psycopg
import pytest

from bench import workflows
from bench.stack import Stack
from bench.workflow_peers import FANIN_CHILDREN, OUTPUT
from testkit.cluster import Cluster


@pytest.fixture
def bench_stack(stack: Cluster, project: Path, tmp_path: Path) -> Stack:
    """The session's cluster with the default project's queue, as the benchmark's Stack."""
    return Stack(stack, tmp_path)


def finished_since(stack: Stack, before: int) -> list[tuple]:
    """The default queue's jobs the history kept after job `before`, in id order: (id, kind,
    status, attempts, result, finished_at)."""
    with stack.cluster.connect() as conn:
        return conn.execute(
            "select id, kind, status, attempts, result, finished_at from pgqueue.job_history "
            "where id > %s and queue = 'default' order by id",
            (before,),
        ).fetchall()


def runs_of(rows: list[tuple], size: int) -> list[list[tuple]]:
    """`rows` in runs of `size` (enqueued one run after the other, so in id order)."""
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def last_id(stack: Stack) -> int:
    with stack.cluster.connect() as conn:
        return conn.execute("select coalesce(max(id), 0) from pgqueue.job_history").fetchone()[0]


def test_a_chain_drained_by_4_processes_runs_each_job_once_in_order(bench_stack: Stack) -> None:
    runs = 30
    before = last_id(bench_stack)

    figures = workflows.drain(bench_stack, "chain", runs, processes=4)

    rows = finished_since(bench_stack, before)
    output = json.loads(OUTPUT)
    assert len(rows) == runs * 3
    for run in runs_of(rows, 3):
        assert [row[1:5] for row in run] == [
            ("a", "done", 1, output),
            ("b", "done", 1, output),
            ("c", "done", 1, output),
        ], run
        # each completed in a transaction that began after its dependency's committed
        for earlier, later in itertools.pairwise(run):
            assert earlier[5] < later[5], run
    assert figures["steps_per_s"] == pytest.approx(figures["runs_per_s"] * 3)
    assert figures["server_cpu_us_per_step"] > 0
    assert figures["start_runs_per_s"] > 0


def test_a_fanin_drained_by_4_processes_runs_the_fanin_once_after_its_last_child(
    bench_stack: Stack,
) -> None:
    runs = 2
    before = last_id(bench_stack)

    figures = workflows.drain(bench_stack, "fanin", runs, processes=4)

    rows = finished_since(bench_stack, before)
    output = json.loads(OUTPUT)
    assert len(rows) == runs * (FANIN_CHILDREN + 1)
    for run in runs_of(rows, FANIN_CHILDREN + 1):
        *children, fanin = run
        assert [row[1] for row in children] == ["child"] * FANIN_CHILDREN
        assert fanin[1] == "fanin"
        assert [row[2:5] for row in run] == [("done", 1, output)] * len(run)
        assert fanin[5] > max(row[5] for row in children), fanin
    assert figures["steps_per_s"] == pytest.approx(figures["runs_per_s"] * (FANIN_CHILDREN + 1))


def test_a_drainer_gives_each_dependent_its_dependencies_results(bench_stack: Stack) -> None:
    workflows.reset(bench_stack)
    with psycopg.connect(bench_stack.dsn(), autocommit=True) as conn:
        [run] = workflows.start_runs(conn, "fanin", 1)
        drainer = workflows.Drainer(conn, "test")
        drainer.drain()

    assert drainer.done == FANIN_CHILDREN + 1
    assert dict(drainer.given) == {run[-1]: run[:-1]}


@pytest.mark.parametrize(
    ("dependencies", "problem"),
    [
        ({}, "0 dependencies of 1, 0 not done"),
        (
            {"7": {"kind": "a", "status": "failed", "result": None}},
            "1 dependencies of 1, 1 not done",
        ),
        (
            {"7": {"kind": "a", "status": "done", "result": {"ok": False}}},
            "1 dependencies of 1, 1 not done",
        ),
        (
            {"7": {"kind": "c", "status": "done", "result": {"ok": True}}},
            "1 dependencies of 1, 1 not done",
        ),
    ],
)
def test_a_dependent_given_other_dependencies_fails_the_drain(
    dependencies: dict, problem: str
) -> None:
    row = (8, "token", "b", {"_dependencies": dependencies})

    with pytest.raises(RuntimeError, match=rf"job 8 \(b\) was given {problem}"):
        workflows.dependencies_of(row)


def test_a_drain_that_leaves_work_undone_fails(bench_stack: Stack) -> None:
    workflows.reset(bench_stack)
    with psycopg.connect(bench_stack.dsn(), autocommit=True) as conn:
        ids = workflows.start_runs(conn, "chain", 3)
        drainer = workflows.Drainer(conn, "test")
        # two calls: the a's claimed, then completed (the b's claimed, never completed)
        drainer.step()
        drainer.step()

    assert drainer.done == 3
    given = dict(drainer.given)
    with pytest.raises(RuntimeError, match=r"3 of 9 jobs done once .*claimed: \(0, 3, 1\)"):
        workflows.check(bench_stack, "chain", ids, given, drainer.done)
    # the b's were given their a's; with the c's given their b's the runs would pass, and a b
    # given another run's a fails
    assert given == {run[1]: [run[0]] for run in ids}
    whole = given | {run[2]: [run[1]] for run in ids}
    workflows.check_dependencies("chain", ids, whole)
    wrong = {**whole, ids[0][1]: [ids[1][0]]}
    with pytest.raises(RuntimeError, match=rf"6 of 6 dependents .*given others: \[{ids[0][1]}\]"):
        workflows.check_dependencies("chain", ids, wrong)
