"""pgflow, the benchmark's workflow peer (bench/workflow_peers.py): its migrations apply on the
vendored pgmq with the Realtime stand-in, and a drain does real work. After a drain by 4
processes, every run is completed and each step ran once, in order, as pgflow's own tables
record it, so the steps/s the scenarios print count completed work; and a drain that leaves
work undone fails."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import psycopg
import pytest

from bench import workflow_peers
from bench.stack import Stack
from testkit.project import REPO, run
from testkit.stack import start_supabase_like_cluster

BENCH = REPO / "bench" / "run"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The benchmark's shape of cluster with the `pgflow` database, pgflow installed by
    bench/run as a benchmark run installs it."""
    run([BENCH, "--setup-only"], timeout=900)
    cluster = start_supabase_like_cluster()
    with cluster.connect(autocommit=True) as conn:
        conn.execute(f"create database {workflow_peers.DATABASE}")
    stack = Stack(cluster, tmp_path_factory.mktemp("pgflow"))
    try:
        yield stack
    finally:
        cluster.destroy()


def connect(stack: Stack) -> psycopg.Connection:
    return stack.cluster.connect(workflow_peers.DATABASE)


def tasks_by_run(conn: psycopg.Connection, flow: str) -> dict[str, list[tuple]]:
    """Each run's tasks: (step, status, attempts, output, started_at, completed_at)."""
    rows = conn.execute(
        "select t.run_id::text, t.step_slug, t.status, t.attempts_count, t.output, "
        "t.started_at, t.completed_at from pgflow.step_tasks t "
        "where t.flow_slug = %s order by t.completed_at",
        (flow,),
    ).fetchall()
    out: dict[str, list[tuple]] = {}
    for run_id, *task in rows:
        out.setdefault(run_id, []).append(tuple(task))
    return out


def run_statuses(conn: psycopg.Connection, flow: str) -> list[str]:
    rows = conn.execute("select status from pgflow.runs where flow_slug = %s", (flow,))
    return [status for (status,) in rows.fetchall()]


def test_pgflow_applies_on_the_vendored_pgmq_with_realtime_stood_in(stack: Stack) -> None:
    workflow_peers.reset(stack)

    with connect(stack) as conn:
        pgmq = conn.execute("select extversion from pg_extension where extname = 'pgmq'")
        steps = conn.execute(
            "select flow_slug, step_slug, step_type, deps_count from pgflow.steps "
            "where flow_slug in ('bench_chain', 'bench_fanin') order by flow_slug, step_index"
        ).fetchall()
        assert pgmq.fetchone() == ("1.5.1",)
    assert steps == [
        ("bench_chain", "a", "single", 0),
        ("bench_chain", "b", "single", 1),
        ("bench_chain", "c", "single", 1),
        ("bench_fanin", "child", "map", 0),
        ("bench_fanin", "fanin", "single", 1),
    ]


def test_a_chain_drained_by_4_processes_runs_each_step_once_in_order(stack: Stack) -> None:
    runs = 30

    figures = workflow_peers.drain(stack, "chain", runs, processes=4)

    with connect(stack) as conn:
        statuses = run_statuses(conn, "bench_chain")
        tasks = tasks_by_run(conn, "bench_chain")
        # each broadcast pgflow sent reached the stand-in: a run's start, its steps, its end
        broadcasts = conn.execute("select count(*) from realtime.messages").fetchone()[0]
    assert statuses == ["completed"] * runs
    assert len(tasks) == runs
    output = json.loads(workflow_peers.OUTPUT)
    for run_tasks in tasks.values():
        assert [task[0] for task in run_tasks] == ["a", "b", "c"], run_tasks
        assert [task[1:4] for task in run_tasks] == [("completed", 1, output)] * 3, run_tasks
        # a step starts only after the step it depends on has completed
        for before, after in itertools.pairwise(run_tasks):
            assert before[5] <= after[4], run_tasks
    assert broadcasts >= runs * 5
    assert figures["steps_per_s"] == pytest.approx(figures["runs_per_s"] * 3)
    assert figures["server_cpu_us_per_step"] > 0


def test_a_fanin_drained_by_4_processes_runs_each_child_once_then_the_fanin(
    stack: Stack,
) -> None:
    runs = 2
    children = workflow_peers.FANIN_CHILDREN

    figures = workflow_peers.drain(stack, "fanin", runs, processes=4)

    with connect(stack) as conn:
        statuses = run_statuses(conn, "bench_fanin")
        tasks = tasks_by_run(conn, "bench_fanin")
        indexes = conn.execute(
            "select array_agg(task_index order by task_index) from pgflow.step_tasks "
            "where flow_slug = 'bench_fanin' and step_slug = 'child' group by run_id"
        ).fetchall()
        # the fan-in step's output is kept with its run: the step ran with every child done
        fanin_steps = conn.execute(
            "select s.status, s.remaining_tasks, s.remaining_deps from pgflow.step_states s "
            "where s.flow_slug = 'bench_fanin' and s.step_slug = 'fanin'"
        ).fetchall()
    assert statuses == ["completed"] * runs
    assert indexes == [(list(range(children)),)] * runs
    assert fanin_steps == [("completed", 0, 0)] * runs
    for run_tasks in tasks.values():
        steps = [task[0] for task in run_tasks]
        assert steps == ["child"] * children + ["fanin"], steps
        assert [task[1:3] for task in run_tasks] == [("completed", 1)] * (children + 1)
        last_child_done = max(task[5] for task in run_tasks[:-1])
        assert run_tasks[-1][4] >= last_child_done, run_tasks[-1]
    assert figures["steps_per_s"] == pytest.approx(figures["runs_per_s"] * (children + 1))


def test_a_drain_that_leaves_work_undone_fails(stack: Stack) -> None:
    workflow_peers.reset(stack)
    with stack.cluster.connect(workflow_peers.DATABASE, autocommit=True) as conn:
        workflow_peers.start_runs(conn, workflow_peers.CHAIN, 3)
        worker = workflow_peers.register_worker(conn, workflow_peers.CHAIN.slug)
        # one round: the three runs' first steps, and nothing after them
        completed, _ = workflow_peers.work(conn, workflow_peers.CHAIN.slug, worker)
    assert completed == 3

    # (the second steps are queued: 6 tasks, 3 of them completed, of the 9 a drain completes)
    with pytest.raises(RuntimeError, match=r"0 of 3 runs completed .*; 3 of 6 tasks .*of 9"):
        workflow_peers.check(stack, workflow_peers.CHAIN, 3)


def test_the_realtime_standin_is_all_pgflow_needs_of_supabase(stack: Stack) -> None:
    """pgflow's migrations name no Supabase schema or role but Realtime's realtime.send(): the
    stand-in covers all it needs from Supabase (pgmq is the real, vendored one)."""
    files = sorted(workflow_peers.MIGRATIONS.glob("*.sql"))
    migrations = "\n".join(p.read_text() for p in files).lower()
    assert len(files) == 12
    for name in ("auth.", "storage.", "net.", "vault.", "service_role", "authenticated", "anon"):
        assert name not in migrations, name
    assert "realtime.send(" in migrations
    assert "realtime." not in migrations.replace("realtime.send(", "")
