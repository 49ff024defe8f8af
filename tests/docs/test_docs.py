"""The user guide builds with mkdocs --strict (broken links and missing pages fail)."""

from __future__ import annotations

from pathlib import Path

from testkit.project import REPO, questions, run


def test_docs_build_strict(tmp_path: Path) -> None:
    run(["mkdocs", "build", "--strict", "--site-dir", tmp_path / "site"], cwd=REPO)
    assert (tmp_path / "site" / "index.html").exists()
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {"prompts", "architecture", "security", "operations", "testing"} <= built


def test_every_question_is_documented() -> None:
    prompts = (REPO / "docs" / "prompts.md").read_text()
    missing = [name for name in questions() if f"`{name}`" not in prompts]
    assert missing == []
