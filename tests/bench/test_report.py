"""bench/report.py's verdicts, without running a benchmark."""

from bench.report import RatioTarget, ratio_targets

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
