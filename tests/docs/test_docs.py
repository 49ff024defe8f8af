"""The user guide builds with mkdocs --strict (broken links and missing pages fail)."""

from __future__ import annotations

import re
from pathlib import Path

from testkit.project import REPO, current_baseline, questions, run


def test_docs_build_strict(tmp_path: Path) -> None:
    run(["mkdocs", "build", "--strict", "--site-dir", tmp_path / "site"], cwd=REPO)
    assert (tmp_path / "site" / "index.html").exists()
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {"prompts", "architecture", "security", "operations", "testing"} <= built


def test_every_question_is_documented() -> None:
    prompts = (REPO / "docs" / "prompts.md").read_text()
    missing = [name for name in questions() if f"`{name}`" not in prompts]
    assert missing == []


def test_prompts_name_the_current_baseline() -> None:
    """docs/prompts.md's `queue_baseline` row names the release a new project starts from (it
    named 1.0.0 long after 1.3.0 was current: issue 50's new-user finding)."""
    prompts = (REPO / "docs" / "prompts.md").read_text()
    (row,) = [line for line in prompts.splitlines() if line.startswith("| `queue_baseline` |")]
    default = row.split("|")[2]
    assert re.findall(r"`(\d+\.\d+\.\d+)`", default) == [current_baseline()], row
