"""Summaries of the repeated measurements: the table on the terminal and the JSON file."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEERS = ("pgqueuer", "procrastinate", "pgmq", "pgflow")
# Which of pgqueuer's and procrastinate's figures a figure of ours is compared with (same kind
# of work).
COMPARE_WITH = {"jobs_per_s": "drain_jobs_per_s", "enqueue_jobs_per_s": "enqueue_jobs_per_s"}


def is_peer(scenario: str) -> bool:
    return scenario in PEERS or scenario.startswith(("pgmq_", "pgflow_"))


def peer_figure(peer: str, scenario: str, figure: str) -> tuple[str, str] | None:
    """(scenario, figure) of `peer` that `figure` of our `scenario` is compared with, if any.
    pgmq has a scenario per process count: a drain is compared with pgmq's read + delete at
    the same number of processes, enqueue_many with send_batch, enqueue_one with send, churn
    with pgmq under the same churn (each figure with its own). A workflow scenario
    (workflow_<shape>_<n>proc) is compared with pgflow's of the same shape and processes, each
    figure with its own, and with no other peer."""
    if scenario.startswith("workflow_"):
        shape = scenario.removeprefix("workflow_")
        return (f"pgflow_{shape}", figure) if peer == "pgflow" else None
    if peer == "pgflow":
        return None
    if scenario == "churn":
        return ("pgmq_churn", figure) if peer == "pgmq" else None
    if scenario.startswith("enqueue_one_"):
        # only pgmq has a single-job enqueue figure, at the same number of connections
        return (f"pgmq_send_{scenario.rsplit('_', 1)[1]}", figure) if peer == "pgmq" else None
    kind = "enqueue_jobs_per_s" if scenario == "enqueue_many" else figure
    if peer != "pgmq":
        return (peer, COMPARE_WITH[kind]) if kind in COMPARE_WITH else None
    if kind == "enqueue_jobs_per_s":
        return ("pgmq_send_batch", "jobs_per_s")
    for processes in ("1proc", "4proc"):
        if figure == "jobs_per_s" and scenario.endswith(f"_{processes}"):
            return (f"pgmq_read_delete_{processes}", "jobs_per_s")
    return None


def unit_of(figure: str) -> str:
    markers = (
        ("us_per_row", "us/row"),
        ("us_per_job", "us/job"),
        ("us_per_call", "us/call"),
        ("bytes_per_job", "B/job"),
        ("rows_per_job", "rows/job"),
        ("updates_per_job", "updates/job"),
        ("tokens_per_job", "tokens/job"),
        ("instructions_per_job", "instr/job"),
        ("jobs_per_s", "jobs/s"),
        ("us_per_step", "us/step"),
        ("us_per_run", "us/run"),
        ("steps_per_s", "steps/s"),
        ("runs_per_s", "runs/s"),
        ("_ms", "ms"),
        ("samples", "jobs"),
        ("vacuums", "runs"),  # (autovacuums too)
        ("_rows", "rows"),
        ("_mb", "MiB"),
        ("_batch", "batch"),
        ("_jobs", "jobs"),
        ("_reads", "reads"),
    )
    for marker, unit in markers:
        if marker in figure:
            return unit
    return "ratio"


def summarize(raw: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """{scenario: {figure: [values]}} -> {scenario: {figure: {unit, values, median, min, max,
    vs_<peer>}}}; a throughput figure gets its ratio to each peer's matching median."""
    out: dict[str, Any] = {}
    for scenario, figures in raw.items():
        out[scenario] = {
            figure: {
                "unit": unit_of(figure),
                "values": [round(v, 3) for v in values],
                "median": round(statistics.median(values), 3),
                "min": round(min(values), 3),
                "max": round(max(values), 3),
            }
            for figure, values in figures.items()
            if values
        }
    for scenario, figures in out.items():
        if is_peer(scenario):
            continue
        for figure, summary in figures.items():
            for peer in PEERS:
                theirs = peer_figure(peer, scenario, figure)
                peer_summary = out.get(theirs[0], {}).get(theirs[1]) if theirs else None
                if peer_summary and peer_summary["median"]:
                    summary[f"vs_{peer}"] = round(summary["median"] / peer_summary["median"], 2)
    return out


@dataclass(frozen=True)
class RatioTarget:
    """`figure` of `scenario` over the same figure of `over` (or, without `over`, the figure
    itself, a ratio measured within the scenario) is at least `minimum`, or, for a figure
    where less is better (CPU per job), at most `maximum`. A `unit` other than "x" makes it a
    bound on the figure itself, in that unit (a time in ms)."""

    scenario: str
    figure: str
    minimum: float | None = None
    over: str | None = None
    maximum: float | None = None
    unit: str = "x"


# Issue 16's targets, each a ratio measured in the same run.
RATIO_TARGETS = (
    # the SQL API's hot path against pgmq's read + delete
    RatioTarget("sql_hot_1proc", "jobs_per_s", 1.5, "pgmq_read_delete_1proc"),
    RatioTarget("sql_hot_4proc", "jobs_per_s", 1.5, "pgmq_read_delete_4proc"),
    # issue 35: the same for jobs stored a row each (enqueue() or enqueue_many() with keys)
    RatioTarget("sql_hot_rows_1proc", "jobs_per_s", 1.5, "pgmq_read_delete_1proc"),
    RatioTarget("sql_hot_rows_4proc", "jobs_per_s", 1.5, "pgmq_read_delete_4proc"),
    # the generated worker, handler path and all, against pgmq's raw SQL
    RatioTarget("worker_postgres_1proc", "jobs_per_s", 1.2, "pgmq_read_delete_1proc"),
    RatioTarget("worker_postgres_4proc", "jobs_per_s", 1.2, "pgmq_read_delete_4proc"),
    RatioTarget("enqueue_many", "jobs_per_s", 1.5, "pgmq_send_batch"),
    # over the Data API (an HTTP request per call)
    RatioTarget("worker_supabase_1proc", "jobs_per_s", 0.6, "pgmq_read_delete_1proc"),
    RatioTarget("worker_supabase_4proc", "jobs_per_s", 0.6, "pgmq_read_delete_4proc"),
    # after 500,000 jobs through the table, at least 70% of the starting claim rate
    RatioTarget("churn", "last_vs_first", 0.7),
    # with 1,000,000 jobs in the history, claims within 10% of an empty one, whether the
    # jobs are stored as enqueue_many() stores them or a row each
    RatioTarget("finished_rows", "full_vs_empty", 0.9),
    RatioTarget("finished_rows", "rows_full_vs_empty", 0.9),
    # issue 38: the gauges cost the same with a million queued jobs as with a thousand
    RatioTarget("gauges_1m", "metrics_ms", maximum=100, unit="ms"),
    RatioTarget("gauges_1m", "stats_ms", maximum=100, unit="ms"),
    # and just before a sweep, after a minute of 1,000 enqueue() calls a second
    RatioTarget("gauges_1m", "metrics_unfolded_ms", maximum=100, unit="ms"),
    RatioTarget("gauges_1m", "stats_unfolded_ms", maximum=100, unit="ms"),
    # issue 51: workflows (a 3-step chain, a fan-in of 100) at least twice pgflow's steps/s
    *(
        RatioTarget(f"workflow_{shape}", "steps_per_s", 2.0, f"pgflow_{shape}")
        for shape in ("chain_1proc", "chain_4proc", "fanin_1proc", "fanin_4proc")
    ),
)


def ratio_targets(
    summary: dict[str, Any], targets: tuple[RatioTarget, ...] = RATIO_TARGETS
) -> list[dict[str, Any]]:
    """Each target whose scenarios were measured: the ratio of the medians, the worst run's
    (run n of one scenario over run n of the other), and whether the median ratio meets it."""
    rows = []
    for target in targets:
        ours = summary.get(target.scenario, {}).get(target.figure)
        theirs = summary.get(target.over, {}).get(target.figure) if target.over else None
        if ours is None or (target.over and not theirs):
            continue
        if theirs:
            ratio = ours["median"] / theirs["median"]
            runs = [a / b for a, b in zip(ours["values"], theirs["values"], strict=False)]
        else:
            ratio, runs = ours["median"], ours["values"]
        # The verdict is taken on the ratio as printed, so 1.4996 shown as 1.5 is not "NOT met".
        ratio = round(ratio, 3)
        row = {
            "scenario": target.scenario,
            "figure": target.figure,
            "over": target.over,
            "unit": target.unit,
        }
        if target.maximum is None:
            row |= {"minimum": target.minimum, "worst_ratio": round(min(runs), 3)}
            row["met"] = ratio >= target.minimum
        else:
            row |= {"maximum": target.maximum, "worst_ratio": round(max(runs), 3)}
            row["met"] = ratio <= target.maximum
        rows.append({**row, "ratio": ratio})
    return rows


def ratio_targets_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        what = f"{row['scenario']} {row['figure']}"
        if row["over"]:
            what += f" / {row['over']}"
        verdict = "met" if row["met"] else "NOT met"
        unit = row.get("unit", "x")
        space = "" if unit == "x" else " "
        bound = f">= {row['minimum']}" if "minimum" in row else f"<= {row['maximum']}"
        lines.append(
            f"target {what}: {row['ratio']:.2f}{space}{unit} (worst run "
            f"{row['worst_ratio']:.2f}{space}{unit}) {bound}{space}{unit}: {verdict}"
        )
    return "\n".join(lines)


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def table(summary: dict[str, Any]) -> str:
    header = ["scenario", "figure", "unit", "median", "min", "max", "n"]
    header += [f"x {peer}" for peer in PEERS]
    rows = [header]
    for scenario, figures in summary.items():
        for figure, s in figures.items():
            ratios = [s.get(f"vs_{peer}") for peer in PEERS]
            rows.append(
                [
                    scenario,
                    figure,
                    s["unit"],
                    _number(s["median"]),
                    _number(s["min"]),
                    _number(s["max"]),
                    str(len(s["values"])),
                    *(f"{r:.2f}x" if r is not None else "" for r in ratios),
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i < 3 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(summary: dict[str, Any]) -> str:
    """The same table in Markdown, for the full runs in docs/maintainers/performance-log.md."""
    head = "| scenario | figure | unit | median | min | max | " + " | ".join(
        f"x {peer}" for peer in PEERS
    )
    lines = [head + " |", "| --- | --- | --- | ---: | ---: | ---: |" + " ---: |" * len(PEERS)]
    for scenario, figures in summary.items():
        for figure, s in figures.items():
            ratios = [s.get(f"vs_{peer}") for peer in PEERS]
            cells = [scenario, figure, s["unit"], *map(_number, (s["median"], s["min"], s["max"]))]
            cells += [f"{r:.2f}x" if r is not None else "" for r in ratios]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
