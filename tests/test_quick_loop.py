"""The quick loop (`scripts/test --quick`, the tests marked `quick`): it must keep a test of each
area it promises, so that it cannot quietly shrink to nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.project import PYTHON_VARIANTS, REPO, VARIANTS


def quick_tests() -> list[str]:
    """The node ids `pytest -m quick` selects, as `scripts/test --quick` runs it."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "deselected" in collected.stdout, "the quick loop selected the whole suite"
    return [line for line in collected.stdout.splitlines() if "::" in line]


@pytest.mark.quick
def test_the_quick_loop_covers_sql_every_variant_and_each_worker() -> None:
    ids = quick_tests()

    def some(prefix: str, suffix: str = "") -> bool:
        return any(i.startswith(prefix) and i.endswith(suffix) for i in ids)

    assert some("tests/sql/test_queue.py::"), "the SQL contract"
    for variant in VARIANTS:
        assert some(
            "tests/render/test_render.py::test_every_variant_renders_cleanly", f"[{variant}]"
        )
    for variant in PYTHON_VARIANTS:
        assert some("tests/worker/test_worker_end_to_end.py::", f"[{variant}]"), variant
    assert some("tests/worker/test_rendered_worker.py::test_project_passes_ruff_mypy")
    assert some("tests/edge/test_edge_worker.py::"), "the edge worker end to end"
    assert some("tests/edge/test_edge_project.py::test_rendered_function_passes_its_own_checks")
