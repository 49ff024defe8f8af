"""The residue checks that every rendered variant must pass (tests/render/test_render.py) each catch
what they name: a file with that residue in a project of its own is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.project import render
from tests.support.residue import RELEASED_MIGRATIONS, residue

GOOD_README = "# App\n\nSome text.\n\n## Part\n\n```sh\nrun it\n```\n\nMore text.\n"

CASES = [
    ("README.md", "# App\n\nText.\n## Part\n\nText.\n", "heading without a blank line before it"),
    ("README.md", "# App\n\n## Part\n```sh\nx\n```\n", "heading without a blank line after it"),
    ("README.md", "# App\n\nText:\n```sh\nx\n```\n", "code fence opens without a blank line"),
    ("README.md", "# App\n\n```sh\nx\n```\nText.\n", "code fence closes without a blank line"),
    ("README.md", "# App\n\nText.\n\n\nMore.\n", "two blank lines in a row"),
    ("README.md", "# App\n\n## Empty\n\n## Next\n\nText.\n", "empty section '## Empty'"),
    ("README.md", "# App\n\nText.\n\n## Last\n", "empty section '## Last'"),
    ("README.md", "# App\n\nA line that stops early,\nand goes on here.\n", "stray line break"),
    ("README.md", "# App\n\n" + "word " * 25 + "\n", "line longer than 100"),
    ("notes.txt", "text  \n", "trailing whitespace"),
    ("notes.txt", "text", "no newline at the end"),
    ("notes.txt", "text\n\n", "blank line at the end"),
    ("notes.txt", "\ntext\n", "blank line at the start"),
    ("notes.txt", "\n", "empty file"),
    ("mod.py", "a = 1\n\n\n\nb = a\n", "three blank lines in a row"),
    (
        "supabase/migrations/20270101000000_pgqueue_next.sql",
        "select coalesce(url, nullif('', ''));\n",
        "nullif of two equal constants",
    ),
    ("x.sql", "select coalesce(a, null);\n", "coalesce with a null argument"),
    ("x.sql", "select 1 where 'a' = 'a';\n", "comparison of two constants"),
    ("x.sql", "select 1 where true;\n", "constant condition"),
    ("pyproject.toml", "[project]\nname = 'x'\ndependencies = []\n", "empty value at project"),
    ("config.toml", "[db]\nport = 1\n\n[api]\n", "empty value at api"),
    (".pre-commit-config.yaml", "repos:\n  - repo: local\n    hooks: []\n", "empty value"),
    ("ci.yml", "on:\n  push:\njobs:\n  lint:\n", "empty value at jobs.lint"),
    ("src/app/util.py", "def helper() -> None:\n    pass\n", "'helper' is defined but never used"),
]


@pytest.mark.parametrize(("name", "text", "finding"), CASES, ids=[c[2] for c in CASES])
def test_each_kind_of_residue_is_reported(
    tmp_path: Path, name: str, text: str, finding: str
) -> None:
    (tmp_path / "README.md").write_text(GOOD_README)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    found = residue(tmp_path)
    assert [f for f in found if finding in f and f.startswith(f"{name}:")], found


def test_clean_files_are_not_reported(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(GOOD_README)
    (tmp_path / "ci.yml").write_text("on:\n  pull_request:\njobs:\n  a:\n    steps: [x]\n")
    (tmp_path / "mod.py").write_text('"""Used."""\n\n\ndef used() -> None:\n    pass\n\n\nused()\n')
    assert residue(tmp_path) == []


def test_only_the_released_migrations_are_exempt(template: Path, tmp_path: Path) -> None:
    """A default (python) project created at 0.1.0 keeps its released wake-up migration's
    `nullif('', '')`: exempt by name, and reported under any other name."""
    project = render(template, tmp_path / "app", queue_baseline="0.1.0")
    [wakeup] = (project / "supabase" / "migrations").glob("*_pgqueue_wakeup.sql")
    assert f"supabase/migrations/{wakeup.name}" in RELEASED_MIGRATIONS
    assert "nullif('', '')" in wakeup.read_text()
    assert not [f for f in residue(project) if "migrations/" in f]
    copy = tmp_path / "copy"
    renamed = copy / "supabase/migrations/20270101000000_pgqueue_wakeup.sql"
    renamed.parent.mkdir(parents=True)
    renamed.write_text(wakeup.read_text())
    (copy / "README.md").write_text(GOOD_README)
    assert [f for f in residue(copy) if "nullif of two equal constants" in f]
