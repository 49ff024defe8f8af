"""Each release folder of the template stands alone (issue 48): a file under queue/<release>/
names only files of its own folder in `extends`, `include`, `import` and `from ... import`,
and holds no `{% block %}` (blocks existed only for a later release to override); a release's
migration in template/supabase/migrations includes only from its own release's folder. A
released folder is then frozen text that no later release can change by overriding it
(docs/maintainers/releases.md)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jinja2
from jinja2 import nodes

from testkit.project import REPO

QUEUE = "queue"
MIGRATIONS = "template/supabase/migrations"
# the release a migration belongs to, from its name: 20261207000000_pgqueue_1_1_0_client_jobs.sql
MIGRATION_RELEASE = re.compile(r"_pgqueue_(\d+)_(\d+)_(\d+)")
REFERENCES = {
    nodes.Extends: "extends",
    nodes.Include: "include",
    nodes.Import: "import",
    nodes.FromImport: "from ... import",
}


def referenced_prefix(template: nodes.Expr) -> str | None:
    """The literal start of the name a reference gives (`"queue/1.2.0/" ~ section` gives
    queue/1.2.0/), or None when the name starts with anything but a literal."""
    while isinstance(template, nodes.Concat):
        template = template.nodes[0]
    if isinstance(template, nodes.Const) and isinstance(template.value, str):
        return template.value
    return None


def problems_in(path: Path, release: str | None, root: Path) -> list[str]:
    """What in `path` reaches out of queue/<release>/ (anything, for no release), or is a
    block."""
    name = path.relative_to(root).as_posix()
    own = f"{QUEUE}/{release}/" if release else None
    found = []
    for node in jinja2.Environment().parse(path.read_text()).find_all((*REFERENCES, nodes.Block)):
        if isinstance(node, nodes.Block):
            found.append(f"{name}:{node.lineno}: a block ({node.name})")
            continue
        kind = REFERENCES[type(node)]
        target = referenced_prefix(node.template)
        if own is None or target is None or not target.startswith(own):
            where = f"{target!r}" if target is not None else "a name not spelled out"
            allowed = f"only {own} may be named" if own else "no queue file may be named"
            found.append(f"{name}:{node.lineno}: {kind} of {where} ({allowed})")
    return found


def cross_release_problems(root: Path) -> list[str]:
    """Every reference across release folders, and every block, under root's queue/ and in its
    template migrations."""
    found = []
    for folder in sorted(p for p in (root / QUEUE).iterdir() if p.is_dir()):
        for path in sorted(folder.rglob("*.jinja")):
            found += problems_in(path, folder.name, root)
    for path in sorted((root / MIGRATIONS).glob("*.jinja")):
        match = MIGRATION_RELEASE.search(path.name)
        found += problems_in(path, ".".join(match.groups()) if match else None, root)
    return found


def test_each_release_folder_stands_alone() -> None:
    folders = [p.name for p in (REPO / QUEUE).iterdir() if p.is_dir()]
    assert {"1.0.0", "1.1.0", "1.2.0"} <= set(folders), "the check reads every release folder"
    assert cross_release_problems(REPO) == []


def test_the_check_names_each_reference_across_releases_and_each_block(tmp_path: Path) -> None:
    shutil.copytree(REPO / QUEUE, tmp_path / QUEUE)
    shutil.copytree(REPO / MIGRATIONS, tmp_path / MIGRATIONS)
    assert cross_release_problems(tmp_path) == []
    plants = {
        "1.1.0/a.sql.jinja": '{%- extends "queue/1.0.0/claim.sql.jinja" -%}\n'
        "{% block claim_front %}select 1;{% endblock %}\n",
        "1.1.0/b.sql.jinja": "{%- from 'queue/1.0.0/macros.sql.jinja' import keep_done -%}\n"
        "{% import 'queue/1.1.0/macros.sql.jinja' as mine %}\n",
        "1.2.0/c.sql.jinja": '{% include "queue/" ~ release ~ "/tables.sql.jinja" %}\n'
        "{% include name %}\n",
        "1.2.0/d.sql.jinja": "-- a block of ids\n{% include 'queue/1.2.0/health.sql.jinja' %}\n",
    }
    for name, text in plants.items():
        (tmp_path / QUEUE / name).write_text(text)
    (tmp_path / MIGRATIONS / "x_pgqueue_1_2_0_more.sql.jinja").write_text(
        '{% include "queue/1.1.0/sweep.sql.jinja" %}\n'
    )
    (tmp_path / MIGRATIONS / "x_pgqueue_old.sql.jinja").write_text(
        '{% include "queue/1.0.0/tables.sql.jinja" %}\n'
    )
    assert cross_release_problems(tmp_path) == [
        "queue/1.1.0/a.sql.jinja:1: extends of 'queue/1.0.0/claim.sql.jinja'"
        " (only queue/1.1.0/ may be named)",
        "queue/1.1.0/a.sql.jinja:2: a block (claim_front)",
        "queue/1.1.0/b.sql.jinja:1: from ... import of 'queue/1.0.0/macros.sql.jinja'"
        " (only queue/1.1.0/ may be named)",
        "queue/1.2.0/c.sql.jinja:1: include of 'queue/' (only queue/1.2.0/ may be named)",
        "queue/1.2.0/c.sql.jinja:2: include of a name not spelled out"
        " (only queue/1.2.0/ may be named)",
        "template/supabase/migrations/x_pgqueue_1_2_0_more.sql.jinja:1: include of"
        " 'queue/1.1.0/sweep.sql.jinja' (only queue/1.2.0/ may be named)",
        "template/supabase/migrations/x_pgqueue_old.sql.jinja:1: include of"
        " 'queue/1.0.0/tables.sql.jinja' (no queue file may be named)",
    ]
