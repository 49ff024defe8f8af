"""bench/report.py's verdicts, without running a benchmark."""

from bench.report import RatioTarget, ratio_targets, summarize

TARGET = (RatioTarget("ours", "jobs_per_s", 1.5, "theirs"),)


def summary(ours: float, theirs: float) -> dict:
    return {
        "ours": {"jobs_per_s": {"median": ours, "values": [ours]}},
        "theirs": {"jobs_per_s": {"median": theirs, "values": [theirs]}},
    }


def test_a_ratio_printed_as_the_minimum_meets_it() -> None:
    # 1.49996 is printed 1.5: the verdict must agree with what is printed (a CI run once
    # reported "1.5x, NOT met" against a minimum of 1.5).
    (row,) = ratio_targets(summary(1.49996, 1.0), TARGET)
    assert row["ratio"] == 1.5
    assert row["met"] is True


def test_a_ratio_below_the_minimum_does_not_meet_it() -> None:
    (row,) = ratio_targets(summary(1.4994, 1.0), TARGET)
    assert row["ratio"] == 1.499
    assert row["met"] is False


def test_a_workflow_scenario_is_compared_with_pgflow_only() -> None:
    # Issue 51: our workflow scenarios against pgflow's of the same shape and processes, each
    # figure with its own; a queue drain is not compared with pgflow, nor a workflow with pgmq.
    raw = {
        "workflow_chain_4proc": {"steps_per_s": [900.0], "server_cpu_us_per_step": [100.0]},
        "pgflow_chain_4proc": {"steps_per_s": [300.0], "server_cpu_us_per_step": [400.0]},
        "pgflow_chain_1proc": {"steps_per_s": [450.0]},
        "sql_hot_4proc": {"jobs_per_s": [5000.0]},
        "pgmq_read_delete_4proc": {"jobs_per_s": [2500.0]},
    }

    out = summarize(raw)

    ours = out["workflow_chain_4proc"]
    assert ours["steps_per_s"]["vs_pgflow"] == 3.0
    assert ours["server_cpu_us_per_step"]["vs_pgflow"] == 0.25
    assert not any(key.startswith("vs_pgmq") for key in ours["steps_per_s"])
    assert "vs_pgflow" not in out["sql_hot_4proc"]["jobs_per_s"]
    assert not any(key.startswith("vs_") for key in out["pgflow_chain_4proc"]["steps_per_s"])
    assert out["pgflow_chain_4proc"]["steps_per_s"]["unit"] == "steps/s"
