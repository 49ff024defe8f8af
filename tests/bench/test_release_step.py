"""bench/release_step.py on a tiny size: it pushes the newest release, then HEAD's step, and
times the calls before and after."""

from bench.release_step import calls, run
from testkit.project import previous_release


def test_release_step_times_each_call_before_and_after_the_step() -> None:
    result = run(previous_release(), jobs=50, history=2_000, repeats=1)

    # HEAD's step for the newest release's projects, and only it
    assert len(result["steps"]) == 1, result["steps"]
    assert "_pgqueue_" in result["steps"][0], result["steps"]
    assert result["step_s"] > 0
    for figures in (result["before"], result["after"]):
        assert set(figures) == set(calls(50)), figures
        assert all(value > 0 for value in figures.values()), figures
