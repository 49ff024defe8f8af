"""What the workflow tests read from the steps' own records, whichever worker ran them: each
record a dict with the step's `name`, `at` ("start" or "end"), `t` (a time) and `job_id`."""

from __future__ import annotations


def check_order(
    records: list[dict],
    ids: dict[str, int],
    waits_on: dict[str, list[str]],
    reran: frozenset = frozenset(),
) -> dict:
    """Each step that ran started once (twice for those `reran`: retried), and after each of
    its dependencies ended; its last "end" record, by name."""
    starts = [r["name"] for r in records if r["at"] == "start"]
    for name in set(starts):
        assert starts.count(name) == (2 if name in reran else 1), (
            f"{name} ran {starts.count(name)}x"
        )
    ends = {r["name"]: r for r in records if r["at"] == "end"}
    started = {r["name"]: r["t"] for r in records if r["at"] == "start"}
    for name, dependencies in waits_on.items():
        for dependency in dependencies:
            assert started[name] >= ends[dependency]["t"], f"{name} ran before {dependency} ended"
        assert ends[name]["job_id"] == ids[name]
    return ends
