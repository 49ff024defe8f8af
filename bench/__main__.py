"""`bench/run`: start a durable local cluster, render a project per transport, run every
scenario --repeats times (interleaved, so a burst of load elsewhere on the machine spreads
over all figures instead of sinking one), print the table and write the JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from . import (
    client_jobs,
    edge_worker,
    flow_control,
    generated_worker,
    hot_path_steps,
    job_list,
    kept_tables,
    peers,
    queue_sql,
    report,
    sql_variants,
    wakeups,
    worker_overhead,
    workflow_peers,
    workflows,
)
from . import stack as stack_module
from .stack import REPO, Stack

Figures = dict[str, float]


@dataclasses.dataclass(frozen=True)
class Sizes:
    jobs: int  # jobs drained per drain/claim figure
    enqueue_jobs: int
    single_jobs: int  # enqueued one a transaction (enqueue_one_*, pgmq_send_*)
    finished: int  # finished jobs kept (history and done batches) for the finished_rows figure
    pgqueuer_jobs: int
    procrastinate_jobs: int
    latency_samples: int
    latency_rate: float
    # the wake-up scenarios: samples at 50/s and at 200/s, isolated jobs and their spacing (s)
    wakeup_50_samples: int
    wakeup_200_samples: int
    isolated_samples: int
    isolated_every: float
    # the churn scenario: jobs through the table, the claim rate of each `churn_segment` of
    # them, with about `churn_backlog` queued at a time
    churn_jobs: int
    churn_segment: int
    churn_backlog: int
    # the flow-control scenarios: the big key's jobs (fairness); the rate limit (jobs/s),
    # its burst and how long claimers hammer it (rate_limit); the limited key's jobs
    # (concurrency_limit)
    fairness_big: int
    rate_per_s: float
    rate_burst: int
    rate_seconds: float
    limited_jobs: int
    # the gauges scenario: queued jobs stored as batches, and as many again a row each
    gauge_jobs: int
    # and single enqueue() calls no sweep has folded yet (a busy minute before the next sweep)
    gauge_unfolded: int
    # the my_jobs scenario: one user's finished jobs (and as many of other users')
    client_finished: int
    edge_jobs: int = 2_000  # the Edge Function's drains (bench/edge_worker.py)
    # the job list scenario: finished jobs kept, and queued ones (bench/job_list.py)
    job_list_finished: int = 1_000_000
    job_list_queued: int = 100_000
    edge_minute_s: float = 60.0  # its trickle and idle spans
    # the workflow scenarios (issue 51): runs of a 3-step chain, and of a fan-in of 100
    # children and the step that depends on them all (bench/workflow_peers.py)
    chain_runs: int = 1_000
    fanin_runs: int = 30


FULL = Sizes(
    20_000, 100_000, 10_000, 1_000_000, 20_000, 1_000, 500, 100.0, 250, 600, 15, 2.0,
    churn_jobs=500_000, churn_segment=50_000, churn_backlog=10_000,
    fairness_big=100_000, rate_per_s=200.0, rate_burst=20, rate_seconds=5.0,
    limited_jobs=2_000, gauge_jobs=1_000_000, gauge_unfolded=60_000, client_finished=10_000,
)  # fmt: skip
# (isolated jobs closer together than in a real run: the smoke run only checks that it works)
SMOKE = Sizes(
    300, 1_000, 100, 2_000, 300, 30, 20, 100.0, 10, 20, 2, 0.5,
    churn_jobs=3_000, churn_segment=500, churn_backlog=500,
    fairness_big=1_000, rate_per_s=100.0, rate_burst=10, rate_seconds=2.0,
    limited_jobs=200, gauge_jobs=2_000, gauge_unfolded=500, client_finished=200,
    edge_jobs=200, edge_minute_s=3.0, job_list_finished=20_000, job_list_queued=4_000,
    chain_runs=20, fanin_runs=2,
)  # fmt: skip
TRANSPORTS = ("postgres", "supabase")


def _peer(name: str, stack: Stack, jobs: int) -> Figures:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.peers", name, stack.dsn(name), str(jobs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker_scenarios(
    sizes: Sizes, transports: dict[str, generated_worker.Transport]
) -> dict[str, Callable[[Stack], Figures]]:
    """The generated worker's scenarios, for each transport that could be set up."""
    out: dict[str, Callable[[Stack], Figures]] = {}
    for name, transport in transports.items():
        # Both transports drain as many jobs as pgmq and the SQL scenarios: the supabase
        # transport sends an HTTP request per claim of a batch, not per job.
        for processes in (1, 4):
            out[f"worker_{name}_{processes}proc"] = lambda s, t=transport, p=processes: (
                generated_worker.drain(s, t, sizes.jobs, p)
            )
        out[f"worker_latency_{name}"] = lambda s, t=transport: generated_worker.latency(
            s, t, sizes.latency_samples, sizes.latency_rate
        )
    return out


def wakeup_scenarios(
    sizes: Sizes,
    ready: set[str],
    standin: generated_worker.StandIn | None,
    linger: float | None,
) -> dict[str, Callable[[Stack], Figures]]:
    """The pg_net wake-up scenarios whose worker could be set up (`ready`); those through
    the Data API need the PostgREST stand-in."""
    runs = wakeups.shapes(
        sizes.wakeup_50_samples,
        sizes.wakeup_200_samples,
        sizes.isolated_samples,
        sizes.isolated_every,
    )
    out: dict[str, Callable[[Stack], Figures]] = {}
    if "wakeup_http_postgres" in ready:
        out["wakeup_http_postgres"] = lambda s: wakeups.python_http(
            s, "wakeup_http_postgres", runs, None, linger
        )
    if standin is not None and "wakeup_http_supabase" in ready:
        out["wakeup_http_supabase"] = lambda s: wakeups.python_http(
            s, "wakeup_http_supabase", runs, standin, linger
        )
    if standin is not None and "wakeup_edge" in ready:
        out["wakeup_edge"] = lambda s: wakeups.edge(s, runs, standin, linger)
    return out


def edge_scenarios(
    sizes: Sizes,
    ready: set[str],
    standin: generated_worker.StandIn | None,
    linger: float | None,
) -> dict[str, Callable[[Stack], Figures]]:
    """The Edge Function worker's own cost (bench/edge_worker.py), when it could be set up."""
    settings = {} if linger is None else {"PGQUEUE_LINGER_MS": str(round(linger * 1000))}
    if standin is None:
        return {}
    return {
        name: lambda s, n=name: edge_worker.run(
            s, n, standin, settings, sizes.edge_jobs, sizes.edge_minute_s
        )
        for name in edge_worker.SCENARIOS
        if name in ready
    }


def scenarios(sizes: Sizes) -> dict[str, Callable[[Stack], Figures]]:
    """The SQL-level and peer scenarios, by name, in the order they run within a repeat."""
    return {
        "commit_latency": lambda s: queue_sql.commit_latency(
            s, samples=200, idle_samples=5, idle_s=sizes.isolated_every
        ),
        "enqueue_many": lambda s: queue_sql.enqueue_many(s, sizes.enqueue_jobs),
        "pgmq_send_batch": lambda s: peers.pgmq_send_batch(s, sizes.enqueue_jobs),
        **{
            name: lambda s, f=f, p=processes: f(s, sizes.single_jobs, p)
            for processes in (1, 4)
            for name, f in (
                (f"enqueue_one_{processes}proc", queue_sql.enqueue_one),
                (f"pgmq_send_{processes}proc", peers.pgmq_send),
            )
        },
        # the same with a NOTIFY per enqueue, as for workers that LISTEN (postgres transport)
        "enqueue_one_notify_4proc": lambda s: queue_sql.enqueue_one(
            s, sizes.single_jobs, 4, notify=True
        ),
        "sql_claim_1proc": lambda s: queue_sql.claim_loop(s, sizes.jobs, processes=1),
        "sql_claim_4proc": lambda s: queue_sql.claim_loop(s, sizes.jobs, processes=4),
        "sql_hot_1proc": lambda s: queue_sql.hot_loop(s, sizes.jobs, processes=1),
        "sql_hot_4proc": lambda s: queue_sql.hot_loop(s, sizes.jobs, processes=4),
        # the same with the jobs stored a row each (enqueued one at a time, or with a priority)
        "sql_hot_rows_1proc": lambda s: queue_sql.hot_loop(s, sizes.jobs, 1, as_rows=True),
        "sql_hot_rows_4proc": lambda s: queue_sql.hot_loop(s, sizes.jobs, 4, as_rows=True),
        # what a complete_and_claim() call costs the server, apart from its jobs
        "call_cost": lambda s: queue_sql.call_cost(s, sizes.jobs),
        "pgmq_call_cost": lambda s: queue_sql.call_cost(s, sizes.jobs, peers.PGMQ_CHURN),
        **{
            f"pgmq_read_{finish}_{processes}proc": lambda s, f=finish, p=processes: (
                peers.pgmq_drain(s, sizes.jobs, p, f)
            )
            for finish in ("delete", "archive")
            for processes in (1, 4)
        },
        "churn": lambda s: queue_sql.churn(
            s, sizes.churn_jobs, sizes.churn_segment, sizes.churn_backlog
        ),
        # what-if: the same, with a VACUUM of the job table every second
        "pgmq_churn": lambda s: queue_sql.churn(
            s, sizes.churn_jobs, sizes.churn_segment, sizes.churn_backlog, queue=peers.PGMQ_CHURN
        ),
        "churn_vacuumed": lambda s: queue_sql.churn(
            s, sizes.churn_jobs, sizes.churn_segment, sizes.churn_backlog, vacuum_every=1.0
        ),
        "notify_latency": lambda s: queue_sql.notify_latency(
            s, sizes.latency_samples, sizes.latency_rate
        ),
        "fairness": lambda s: flow_control.fairness(s, sizes.fairness_big),
        "rate_limit": lambda s: flow_control.rate_limit(
            s, sizes.rate_per_s, sizes.rate_burst, sizes.rate_seconds
        ),
        "concurrency_limit": lambda s: flow_control.concurrency_limit(s, sizes.limited_jobs),
        # metrics() and stats with a million queued jobs as batches and a million as rows
        "gauges_1m": lambda s: queue_sql.gauges(s, sizes.gauge_jobs, sizes.gauge_unfolded),
        # the newest 20 of a user's finished jobs in my_jobs, and a submit under the caps
        "my_jobs": lambda s: client_jobs.my_jobs_page(s, sizes.client_finished),
        # the dashboard's job list: each filter's first page, a deep page and its count
        "job_list": lambda s: job_list.measure(s, sizes.job_list_finished, sizes.job_list_queued),
        "pgqueuer": lambda s: _peer("pgqueuer", s, sizes.pgqueuer_jobs),
        "procrastinate": lambda s: _peer("procrastinate", s, sizes.procrastinate_jobs),
        # our workflows and pgflow's SQL core, each driven as its worker drives it: runs of a
        # chain and of a fan-in
        **{
            f"{side}_{shape}_{processes}proc": lambda s, d=drain, w=shape, n=runs, p=processes: d(
                s, w, n, p
            )
            for side, drain in (("workflow", workflows.drain), ("pgflow", workflow_peers.drain))
            for shape, runs in (("chain", sizes.chain_runs), ("fanin", sizes.fanin_runs))
            for processes in (1, 4)
        },
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/run",
        description="Benchmark the generated queue against pgmq, pgqueuer, procrastinate and "
        "pgflow on a local cluster with durable commits. Prints a table, writes JSON.",
        epilog="scenarios: "
        + ", ".join(_known(FULL))
        + ". Method and latest figures: docs/performance.md",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scenario")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks that every scenario runs"
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain/claim figure")
    parser.add_argument("--finished", type=int, help="finished rows for the table-size figure")
    parser.add_argument(
        "--only", nargs="+", metavar="SCENARIO", help="run only these scenarios (names below)"
    )
    parser.add_argument(
        "--sql-variants",
        action="store_true",
        help="instead of the scenarios: time claim/complete_many/enqueue_many per row, EXPLAIN "
        "them, and measure proposed changes to the SQL on scratch schemas",
    )
    parser.add_argument(
        "--hot-path-steps",
        action="store_true",
        help="instead of the scenarios: measure what each change of the hot path bought, step "
        "by step from claim + complete_many to complete_and_claim, on scratch schemas, then "
        "pgqueue as migrated (flow control, nothing set) and pgmq (server and client CPU, WAL "
        "per job, jobs/s)",
    )
    parser.add_argument(
        "--kept-tables",
        action="store_true",
        help="instead of the scenarios: what claimed_keys and job_progress buy, against the "
        "statements a claim row holding their data would run (server CPU and WAL per call)",
    )
    parser.add_argument(
        "--worker-overhead",
        action="store_true",
        help="instead of the scenarios: the generated worker's own CPU time and instructions "
        "(valgrind) per job, draining --jobs no-op jobs from a queue in memory (no database)",
    )
    parser.add_argument(
        "--patch",
        choices=sorted(sql_variants.PATCHES),
        action="append",
        default=[],
        help="what-if: apply a proposed SQL change (bench/sql_variants.py) to the queue first",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also drain jobs with one worker of each transport under pyinstrument and write "
        "their reports next to the JSON",
    )
    parser.add_argument(
        "--linger",
        type=float,
        metavar="SECONDS",
        help="what-if for the wakeup_* scenarios: the workers' linger window (python-http: "
        "WORKER_LINGER_SECONDS, edge: PGQUEUE_LINGER_MS; 0 turns it off) instead of their "
        "defaults",
    )
    parser.add_argument(
        "--out", type=Path, help="JSON file (default: bench/results/<UTC timestamp>.json)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    if args.jobs:
        sizes = dataclasses.replace(sizes, jobs=args.jobs, pgqueuer_jobs=args.jobs)
    if args.finished:
        sizes = dataclasses.replace(sizes, finished=args.finished)
    started = datetime.now(UTC)
    out = args.out or REPO / "bench" / "results" / f"{started:%Y%m%dT%H%M%SZ}.json"
    known = _known(sizes)
    wanted = (
        [] if args.sql_variants or args.hot_path_steps or args.kept_tables else args.only or known
    )
    unknown = set(wanted) - set(known)
    if unknown:
        names = ", ".join(known)
        print(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {names}", file=sys.stderr)
        return 2

    if args.worker_overhead:
        return _worker_overhead(sizes.jobs, args.repeats, out, started)

    print(f"bench: starting a durable cluster and rendering projects ({sizes})", file=sys.stderr)
    began = time.monotonic()
    stack = stack_module.start(TRANSPORTS)
    print(f"bench: stack ready {time.monotonic() - began:.1f}s", file=sys.stderr)
    try:
        document = {
            "started_at": started.isoformat(timespec="seconds"),
            "machine": stack_module.machine(),
            # pg_test_fsync takes ~15 s: not for a smoke run
            "disk": {} if args.smoke else stack_module.fsync_rate(stack.workdir),
            "server": stack_module.server_settings(stack),
            "sizes": sizes.__dict__,
            "repeats": args.repeats,
            "patches": args.patch,
            "linger_s": args.linger,
        }
        for name in args.patch:
            sql_variants.PATCHES[name](stack)
        if args.sql_variants:
            print("bench: SQL variants", file=sys.stderr)
            raw = sql_variants.run(stack, stack.projects["postgres"], sizes.jobs, args.repeats)
            plans = out.with_suffix(".explain.txt")
            plans.parent.mkdir(parents=True, exist_ok=True)
            plans.write_text(sql_variants.explain(stack))
            print(f"bench: wrote {plans}", file=sys.stderr)
        elif args.hot_path_steps:
            print("bench: hot path steps", file=sys.stderr)
            raw = hot_path_steps.run(stack, sizes.jobs, args.repeats)
        elif args.kept_tables:
            print("bench: what claimed_keys and job_progress buy", file=sys.stderr)
            raw = kept_tables.run(stack, args.repeats)
        else:
            raw = _run_scenarios(stack, sizes, wanted, args.repeats, document, args.linger)
            if args.profile:
                for name in TRANSPORTS:
                    profile = out.with_suffix(f".worker-{name}-profile.txt")
                    _profile_worker(stack, name, sizes.jobs, profile)
                    print(f"bench: wrote {profile}", file=sys.stderr)
    finally:
        stack.destroy()
    document["loadavg_at_end"] = os.getloadavg()
    document["elapsed_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    document["scenarios"] = report.summarize(raw)
    if args.hot_path_steps:
        hot_path_steps.add_pgmq_ratios(document["scenarios"])
        document["steps"] = {step.name: step.change for step in hot_path_steps.STEPS}
        document["ratio_targets"] = report.ratio_targets(
            document["scenarios"], hot_path_steps.TARGETS
        )
        print(hot_path_steps.table(document["scenarios"]))
        print(report.ratio_targets_table(document["ratio_targets"]))
        report.write_json(out, document)
        print(f"bench: wrote {out}", file=sys.stderr)
        return 0
    document["targets"] = wakeups.targets(document["scenarios"])
    document["ratio_targets"] = report.ratio_targets(document["scenarios"])
    document["flow_control_targets"] = flow_control.targets(document["scenarios"])
    print(report.table(document["scenarios"]))
    if document["targets"]:
        print(wakeups.targets_table(document["targets"]))
    if document["ratio_targets"]:
        print(report.ratio_targets_table(document["ratio_targets"]))
    if document["flow_control_targets"]:
        print(flow_control.targets_table(document["flow_control_targets"]))
    report.write_json(out, document)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _worker_overhead(jobs: int, repeats: int, out: Path, started: datetime) -> int:
    print(f"bench: the worker's own cost, {jobs:,} jobs from memory", file=sys.stderr)
    document = {
        "started_at": started.isoformat(timespec="seconds"),
        "machine": stack_module.machine(),
        "jobs": jobs,
        "repeats": repeats,
        "scenarios": report.summarize(worker_overhead.run(jobs, repeats)),
    }
    print(report.table(document["scenarios"]))
    report.write_json(out, document)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _known(sizes: Sizes) -> list[str]:
    """Every scenario's name, in the order they run within a repeat."""
    workers = worker_scenarios(sizes, dict.fromkeys(TRANSPORTS))
    return [*scenarios(sizes), *workers, *wakeups.PROJECTS, *edge_worker.SCENARIOS, "finished_rows"]


def _profile_worker(stack: Stack, name: str, jobs: int, profile: Path) -> None:
    profile.parent.mkdir(parents=True, exist_ok=True)
    why = generated_worker.install({name: stack.projects[name]})[name]
    if why:
        raise RuntimeError(why)
    transport = generated_worker.Transport(stack, name)
    try:
        generated_worker.drain(stack, transport, jobs, 1, profile=profile)
    finally:
        transport.close()
        generated_worker.uninstall(stack.projects)


def _run_scenarios(
    stack: Stack,
    sizes: Sizes,
    wanted: list[str],
    repeats: int,
    document: dict,
    linger: float | None = None,
) -> dict[str, dict[str, list[float]]]:
    raw: dict[str, dict[str, list[float]]] = {}
    load: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    transports: dict[str, generated_worker.Transport] = {}
    standin: generated_worker.StandIn | None = None
    document["skipped"] = skipped
    document["load_1min_at_each_run"] = load
    needed = [
        name
        for name in TRANSPORTS
        if any(w.startswith("worker_") and name in w.split("_") for w in wanted)
    ]
    woken = [name for name in wakeups.PROJECTS if name in wanted]
    edge_wanted = [name for name in edge_worker.SCENARIOS if name in wanted]
    # the python-http projects of the wake-up scenarios are installed with the others
    python_http = {wakeups.PROJECTS[name]: name for name in woken if name != "wakeup_edge"}
    projects = [*needed, *python_http]
    try:
        began = time.monotonic()
        installed = generated_worker.install({name: stack.projects[name] for name in projects})
        if "wakeup_edge" in woken or edge_wanted:
            installed["edge"] = wakeups.install_edge(stack.projects["edge"]) or (
                edge_worker.install(stack.projects["edge"])
            )
        took = time.monotonic() - began
        print(f"bench: installed the rendered projects {took:.1f}s", file=sys.stderr)
        ready: set[str] = set()
        for name, why in installed.items():
            scenario = python_http.get(name) or ("wakeup_edge" if name == "edge" else None)
            if why is None and scenario:
                ready.add(scenario)  # the scenario starts its own worker
            elif why is None:
                try:
                    transports[name] = generated_worker.Transport(stack, name)
                except Exception as exc:
                    why = f"cannot start the {name} transport: {exc!r}"
            if why:
                skipped[scenario or f"worker_{name}"] = why
                print(f"bench: skipping the {name} worker: {why}", file=sys.stderr)
        if "wakeup_edge" in ready:
            ready |= set(edge_wanted)
        if ready & {"wakeup_http_supabase", "wakeup_edge"}:
            standin = generated_worker.StandIn(stack)
        repeated = (
            scenarios(sizes)
            | worker_scenarios(sizes, transports)
            | wakeup_scenarios(sizes, ready, standin, linger)
            | edge_scenarios(sizes, ready, standin, linger)
        )
        for repeat in range(repeats):
            for name, run in repeated.items():
                if name not in wanted:
                    continue
                load.setdefault(name, []).append(round(os.getloadavg()[0], 2))
                began = time.monotonic()
                for figure, value in run(stack).items():
                    raw.setdefault(name, {}).setdefault(figure, []).append(value)
                took = time.monotonic() - began
                print(f"bench: {name} (run {repeat + 1}/{repeats}) {took:.1f}s", file=sys.stderr)
        if "finished_rows" in wanted:
            print(f"bench: finished_rows ({sizes.finished:,} rows)", file=sys.stderr)
            load["finished_rows"] = [round(os.getloadavg()[0], 2)]
            raw["finished_rows"] = queue_sql.finished_rows(
                stack, sizes.jobs, sizes.finished, repeats
            )
    finally:
        for transport in transports.values():
            transport.close()
        if standin is not None:
            standin.close()
        if projects:
            generated_worker.uninstall(stack.projects)
    return raw


if __name__ == "__main__":
    sys.exit(main())
