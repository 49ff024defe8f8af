"""The benchmark (bench/run) on tiny sizes, so it never rots: every scenario runs and reports
numbers. The figures themselves are docs/performance.md's business, not this test's."""

from __future__ import annotations

import json
import math
from pathlib import Path

from testkit.project import REPO, run

BENCH = REPO / "bench" / "run"
SCENARIOS = {
    "commit_latency": {"p50_ms", "p95_ms", "after_idle_p50_ms"},
    "enqueue_many": {"jobs_per_s"},
    "sql_claim_1proc": {"jobs_per_s"},
    "sql_claim_4proc": {"jobs_per_s"},
    "sql_hot_1proc": {"jobs_per_s"},
    "sql_hot_4proc": {"jobs_per_s"},
    "sql_hot_rows_4proc": {"jobs_per_s"},
    # what a call costs the server apart from its jobs; for pgmq a "call" is read + delete
    **{
        scenario: {
            "server_us_per_call_of_1",
            "server_us_per_call_of_100",
            "fixed_server_us_per_call",
            "server_us_per_job",
        }
        for scenario in ("call_cost", "pgmq_call_cost")
    },
    # 3,000 jobs in segments of 500 on the smoke run
    "churn": {
        *(f"segment_{n:02d}_jobs_per_s" for n in range(1, 7)),
        "overall_jobs_per_s",
        "last_vs_first",
    },
    # pgmq under the same churn (the run fails if a message is left in its queue)
    "pgmq_churn": {
        *(f"segment_{n:02d}_jobs_per_s" for n in range(1, 7)),
        "overall_jobs_per_s",
        "last_vs_first",
    },
    # the same with a VACUUM every second (a what-if; it may not come round on the smoke run)
    "churn_vacuumed": {
        *(f"segment_{n:02d}_jobs_per_s" for n in range(1, 7)),
        "overall_jobs_per_s",
        "last_vs_first",
    },
    "notify_latency": {"p50_ms", "p95_ms", "p99_ms"},
    # metrics() and stats with jobs queued as batches and as rows (the median of 5 calls)
    "gauges_1m": {"metrics_ms", "stats_ms", "metrics_unfolded_ms", "stats_unfolded_ms"},
    # a page of a signed-in user's finished jobs (the newest 20), and one submit (issue 47)
    "my_jobs": {"newest_20_ms", "submit_ms"},
    "pgqueuer": {"enqueue_jobs_per_s", "drain_jobs_per_s"},
    "procrastinate": {"enqueue_jobs_per_s", "drain_jobs_per_s"},
    # (each pgmq drain fails the run if it leaves a message in the queue, or, for archive,
    # one out of the archive)
    "pgmq_send_batch": {"jobs_per_s"},
    **{
        f"pgmq_read_{finish}_{processes}proc": {"jobs_per_s"}
        for finish in ("delete", "archive")
        for processes in (1, 4)
    },
    # our workflows and pgflow, the workflow peer (issue 51): runs of a chain and of a fan-in,
    # drained by each one's worker's SQL calls (the run fails unless each run completed with
    # each step run once, and for ours each dependent given its dependencies' results)
    **{
        f"{side}_{shape}_{processes}proc": {
            "steps_per_s",
            "runs_per_s",
            "start_runs_per_s",
            "server_cpu_us_per_step",
            "start_server_cpu_us_per_run",
        }
        for side in ("workflow", "pgflow")
        for shape in ("chain", "fanin")
        for processes in (1, 4)
    },
    "finished_rows": {
        f"{storage}{figure}"
        for storage in ("", "rows_")
        for figure in ("empty_jobs_per_s", "full_jobs_per_s", "full_vs_empty")
    },
    # issue 17's flow control (the rate limit's worst excess is not listed: at most 0)
    "fairness": {
        *(f"key_{n:02d}_{end}_batch" for n in range(1, 11) for end in ("first", "last")),
        "all_small_started_batch",
        "keyed_jobs_per_s",
        "unkeyed_jobs_per_s",
        "keyed_vs_unkeyed",
        "keyed_server_cpu_us_per_job",
        "unkeyed_server_cpu_us_per_job",
    },
    "rate_limit": {
        "limit_jobs_per_s",
        "burst_jobs",
        "claimed_jobs",
        "claimed_jobs_per_s",
        "max_in_1s_jobs",
    },
    "concurrency_limit": {
        "jobs_per_s",
        "limit_jobs",
        "max_running_jobs",
        "mean_running_jobs",
        "max_held_jobs",
        "sampler_reads",
    },
    # the generated project's own worker, through its handler registry
    "worker_postgres_1proc": {"jobs_per_s", "cpu_us_per_job"},
    "worker_postgres_4proc": {"jobs_per_s", "cpu_us_per_job"},
    "worker_latency_postgres": {"p50_ms", "p95_ms", "p99_ms"},
    "worker_supabase_1proc": {"jobs_per_s", "cpu_us_per_job"},
    "worker_supabase_4proc": {"jobs_per_s", "cpu_us_per_job"},
    "worker_latency_supabase": {"p50_ms", "p95_ms", "p99_ms"},
    # each worker style woken through the real pg_net, under each load shape
    **{
        scenario: {
            f"{shape}_{figure}"
            for shape in ("steady_50", "steady_200", "isolated")
            for figure in (
                "p50_ms",
                "p95_ms",
                "p99_ms",
                "after_commit_p50_ms",
                "after_commit_p95_ms",
                "enqueue_p50_ms",
                "samples",
            )
        }
        for scenario in ("wakeup_http_postgres", "wakeup_http_supabase", "wakeup_edge")
    },
    # the Edge Function worker's own cost
    "edge_drain_noop": {"jobs_per_s", "cpu_us_per_job"},
    "edge_drain_cpu_1ms": {"jobs_per_s", "cpu_us_per_job"},
    "edge_trickle": {"cpu_ms_per_minute"},
    "edge_idle": {"cpu_ms_per_minute"},
}


def test_bench_runs_every_scenario_on_a_tiny_size(tmp_path: Path) -> None:
    # Installing bench/.venv the first time is not what the time limit is about.
    run([BENCH, "--setup-only"], timeout=900)
    out = tmp_path / "result.json"

    printed = run([BENCH, "--smoke", "--repeats", "1", "--out", out], timeout=300)

    result = json.loads(out.read_text())
    assert not result["skipped"], f"scenarios were skipped: {result['skipped']}"
    scenarios = result["scenarios"]
    for scenario, figures in SCENARIOS.items():
        assert scenario in scenarios, f"{scenario} missing from {sorted(scenarios)}"
        assert figures <= set(scenarios[scenario]), f"{scenario}: {sorted(scenarios[scenario])}"
        for figure, summary in scenarios[scenario].items():
            values = [summary[key] for key in ("min", "median", "max")]
            assert all(isinstance(v, int | float) and math.isfinite(v) for v in values), summary
            assert values == sorted(values), f"{scenario}.{figure}: {summary}"
            # (a handler may start before the sender's commit returns to it: the database has
            # committed, but the sender's process, descheduled on a busy machine, reads the
            # clock later. An after_commit offset may be negative; the other listed figures
            # may not)
            if figure in figures and "after_commit" not in figure:
                assert values[0] > 0, f"{scenario}.{figure}: {summary}"
    # Every throughput figure of ours is compared with each peer; with pgmq, at the same
    # number of processes.
    for scenario in (
        "sql_claim_1proc",
        "sql_hot_4proc",
        "worker_postgres_4proc",
        "worker_supabase_1proc",
    ):
        ours = scenarios[scenario]["jobs_per_s"]
        assert {"vs_pgqueuer", "vs_procrastinate", "vs_pgmq"} <= set(ours), scenario
        pgmq = scenarios[f"pgmq_read_delete_{scenario[-5:]}"]["jobs_per_s"]
        assert ours["vs_pgmq"] == round(ours["median"] / pgmq["median"], 2), scenario
    # Each workflow figure of ours is compared with pgflow's of the same shape and processes.
    for shape in ("chain_1proc", "chain_4proc", "fanin_1proc", "fanin_4proc"):
        for figure in SCENARIOS[f"workflow_{shape}"]:
            ours = scenarios[f"workflow_{shape}"][figure]
            pgflow = scenarios[f"pgflow_{shape}"][figure]
            assert ours["vs_pgflow"] == round(ours["median"] / pgflow["median"], 2), figure
    enqueue = scenarios["enqueue_many"]["jobs_per_s"]
    pgmq = scenarios["pgmq_send_batch"]["jobs_per_s"]
    assert enqueue["vs_pgmq"] == round(enqueue["median"] / pgmq["median"], 2)
    # The churn curve: its segments, and the last over the first.
    churn = scenarios["churn"]
    segments = [figure for figure in churn if figure.startswith("segment_")]
    assert len(segments) == result["sizes"]["churn_jobs"] // result["sizes"]["churn_segment"]
    last_vs_first = churn[segments[-1]]["median"] / churn[segments[0]]["median"]
    assert math.isclose(churn["last_vs_first"]["median"], last_vs_first, rel_tol=0.01)
    # Each of issue 16's ratio targets (with issue 35's for jobs stored as rows, issue 38's
    # four bounds on the gauges' time and issue 51's four workflow ratios to pgflow) is checked
    # against what was measured, and printed.
    assert len(result["ratio_targets"]) == 20, result["ratio_targets"]
    for row in result["ratio_targets"]:
        assert row["ratio"] > 0 and row["worst_ratio"] > 0, row
        if "minimum" in row:
            assert row["met"] == (row["ratio"] >= row["minimum"]), row
        else:
            assert row["unit"] == "ms", row
            median = scenarios[row["scenario"]][row["figure"]]["median"]
            assert row["ratio"] == round(median, 3), row
            assert row["met"] == (row["ratio"] <= row["maximum"]), row
        assert f"target {row['scenario']} {row['figure']}" in printed
    # Each wake-up target is checked against what was measured, and printed.
    checked = {(row["scenario"], row["shape"]) for row in result["targets"]}
    assert len(checked) == 9, result["targets"]
    for row in result["targets"]:
        p95 = scenarios[row["scenario"]][f"{row['shape']}_p95_ms"]["median"]
        assert row["met"] == (p95 <= row["target_p95_ms"]), row
        assert f"target {row['scenario']} {row['shape']}: p95" in printed
        # Each job's latency from its commit returning is its latency from the enqueue call's
        # start less that call's own time: never more, at any percentile.
        figures = scenarios[row["scenario"]]
        shape = row["shape"]
        assert figures[f"{shape}_enqueue_p50_ms"]["min"] > 0, figures
        for p in ("p50", "p95"):
            after = figures[f"{shape}_after_commit_{p}_ms"]["median"]
            assert after < figures[f"{shape}_{p}_ms"]["median"], (shape, p, figures)
    # Flow control: the small keys start within the first batches despite the big key's
    # backlog ahead of them; no window of the rate-limited claims exceeds burst + rate * T,
    # nor any second burst + rate, yet the limit lets jobs through; the limited key never runs
    # more jobs at once than its limit, as counted from outside and as held by the claimers.
    fairness = scenarios["fairness"]
    last = fairness["all_small_started_batch"]["max"]
    assert last <= 2, fairness
    for n in range(1, 11):
        first_batch = fairness[f"key_{n:02d}_first_batch"]["max"]
        assert first_batch <= fairness[f"key_{n:02d}_last_batch"]["max"] <= last, (n, fairness)
    rated = scenarios["rate_limit"]
    rate, burst = rated["limit_jobs_per_s"]["median"], rated["burst_jobs"]["median"]
    assert rated["worst_excess_jobs"]["max"] <= 0, rated
    assert rated["max_in_1s_jobs"]["max"] <= burst + rate, rated
    assert rated["claimed_jobs_per_s"]["min"] >= rate / 2, rated
    limited = scenarios["concurrency_limit"]
    limit = limited["limit_jobs"]["median"]
    assert 1 <= limited["max_running_jobs"]["max"] <= limit, limited
    assert 1 <= limited["max_held_jobs"]["max"] <= limit, limited
    checked = {(row["scenario"], row["figure"]) for row in result["flow_control_targets"]}
    assert checked == {
        ("fairness", "all_small_started_batch"),
        ("rate_limit", "worst_excess_jobs"),
        ("concurrency_limit", "max_running_jobs"),
        ("concurrency_limit", "max_held_jobs"),
    }, result["flow_control_targets"]
    for row in result["flow_control_targets"]:
        assert row["met"], row
        assert f"target {row['scenario']} {row['figure']}: " in printed
    assert result["server"]["fsync"] == "on"
    assert result["server"]["synchronous_commit"] == "on"
    assert "sql_claim_4proc" in printed and "x pgqueuer" in printed


def test_sql_variants_still_apply_to_the_migrations(tmp_path: Path) -> None:
    """`--sql-variants` edits the rendered migrations by text: when a migration changes under
    it, a variant must fail loudly (not measure the unchanged SQL), and this test notices."""
    run([BENCH, "--setup-only"], timeout=900)
    out = tmp_path / "variants.json"

    run([BENCH, "--smoke", "--sql-variants", "--repeats", "1", "--out", out], timeout=300)

    scenarios = json.loads(out.read_text())["scenarios"]
    assert {"v_base", "v_claim_async_commit"} <= set(scenarios)
    for name, figures in scenarios.items():
        for figure in ("jobs_per_s", "claim_us_per_row", "enqueue_jobs_per_s"):
            assert figures[figure]["median"] > 0, (name, figure, figures[figure])
    plans = out.with_suffix(".explain.txt").read_text()
    assert "Delete on jobs" in plans and "jobs_claim_idx" in plans


def test_hot_path_steps_each_change_what_it_says(tmp_path: Path) -> None:
    """`--hot-path-steps` measures the hot path's changes one at a time: each step must really
    differ from the one before it as its name says, or its figures would be credited to the
    wrong change."""
    run([BENCH, "--setup-only"], timeout=900)
    out = tmp_path / "steps.json"

    printed = run(
        [BENCH, "--smoke", "--hot-path-steps", "--repeats", "1", "--out", out], timeout=300
    )

    result = json.loads(out.read_text())
    steps = result["scenarios"]
    names = [
        "two_calls",
        "one_call",
        "one_token",
        "hot_claims",
        "done_batches",
        "flow_control",
        "claims",
        "pgmq",
    ]
    assert list(steps) == names
    assert list(result["steps"]) == names
    median = {name: {f: s["median"] for f, s in figures.items()} for name, figures in steps.items()}
    for name, figures in steps.items():
        for figure in (
            "server_cpu_us_per_job",
            "client_cpu_us_per_job",
            "wal_bytes_per_job",
            "jobs_per_s",
        ):
            assert figures[figure]["median"] > 0, (name, figure, figures[figure])
            pgmq = steps["pgmq"][figure]["median"]
            assert figures[figure]["vs_pgmq"] == round(figures[figure]["median"] / pgmq, 2)
        assert name in printed
    assert "x pgmq" in printed
    # Two calls: a claim and a completion, both updates; then one update (the claim) a job.
    assert median["two_calls"]["updates_per_job"] == 1 + median["one_call"]["updates_per_job"]
    assert median["one_call"]["updates_per_job"] == 1
    # Before hot_claims a claim is never a HOT update, from then on most are.
    for name in ("two_calls", "one_call", "one_token"):
        assert median[name]["hot_update_share"] == 0, name
    for name in ("hot_claims", "done_batches", "flow_control"):
        assert median[name]["hot_update_share"] > 0.5, name
    # Leases per claim: a claim deletes its jobs instead of updating them.
    assert median["claims"]["updates_per_job"] == 0
    # Done jobs stay in the job table, then take a history row each, then a row per call.
    assert median["two_calls"]["history_rows_per_job"] == 0
    for name in ("one_call", "one_token", "hot_claims"):
        assert median[name]["history_rows_per_job"] == 1, name
    for name in ("done_batches", "flow_control", "claims"):
        assert median[name]["history_rows_per_job"] == 1 / 100, name
    # A lock token per job, then one per call (batch 100).
    for name in ("two_calls", "one_call"):
        assert median[name]["tokens_per_job"] == 1, name
    for name in ("one_token", "hot_claims", "done_batches", "flow_control", "claims"):
        assert median[name]["tokens_per_job"] == 1 / 100, name
    # Issue 17's cost: flow control with no keys, limits or pause against the hot path as its
    # migration left it, checked against what was measured, and printed.
    targets = {row["figure"]: row for row in result["ratio_targets"]}
    assert set(targets) == {"server_cpu_us_per_job", "jobs_per_s"}, result["ratio_targets"]
    for figure, row in targets.items():
        assert (row["scenario"], row["over"]) == ("flow_control", "done_batches"), row
        ratio = median["flow_control"][figure] / median["done_batches"][figure]
        assert math.isclose(row["ratio"], ratio, rel_tol=0.01), row
        assert row["met"] == (
            ratio <= row["maximum"] if "maximum" in row else ratio >= row["minimum"]
        ), row
        assert f"target flow_control {figure} / done_batches" in printed


def test_kept_tables_measure_both_designs_and_check_their_answers(tmp_path: Path) -> None:
    """`--kept-tables` runs the queue's calls and the merged design's statements taking turns;
    each design must answer as the queue does (the run fails when the merged key_holder() does
    not find a running job by its key, or a merged report is not shown), and WAL is written
    for every figure, so no call measured nothing."""
    run([BENCH, "--setup-only"], timeout=900)
    out = tmp_path / "kept.json"

    run([BENCH, "--smoke", "--kept-tables", "--repeats", "2", "--out", out], timeout=300)

    scenarios = json.loads(out.read_text())["scenarios"]
    calls = ("enqueue_keyed", "enqueue_many_keyed", "progress")
    assert set(scenarios) == {f"{c}_{d}" for c in calls for d in ("kept", "merged")}
    for name, figures in scenarios.items():
        assert len(figures["server_cpu_us_per_job"]["values"]) == 2, name
        assert figures["server_cpu_us_per_job"]["min"] > 0, name
        assert figures["wal_bytes_per_job"]["min"] > 0, name


def test_worker_overhead_counts_the_workers_own_cost(tmp_path: Path) -> None:
    """`--worker-overhead` drains jobs through the rendered worker from a queue in memory (the
    child fails the run unless every job was completed and counted done) and reports its CPU
    time and instructions per job."""
    run([BENCH, "--setup-only"], timeout=900)
    out = tmp_path / "overhead.json"

    printed = run(
        [BENCH, "--smoke", "--worker-overhead", "--repeats", "2", "--out", out], timeout=300
    )

    figures = json.loads(out.read_text())["scenarios"]["worker_overhead"]
    assert len(figures["cpu_us_per_job"]["values"]) == 2
    assert figures["cpu_us_per_job"]["median"] > 0
    # A job costs the worker thousands of instructions, not the start-up's millions.
    assert 1_000 < figures["instructions_per_job"]["median"] < 10_000_000, figures
    assert "instructions_per_job" in printed
