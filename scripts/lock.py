"""`scripts/lock`: write locks/<worker_style>-<claim_transport>.uv.lock for each Python variant,
and locks/edge-dashboard.uv.lock for the edge variant's dashboard/ (a Python project too).

Each project is rendered with the default answers, `uv lock` resolves it (`--upgrade`: the
newest releases that fit its pyproject.toml.jinja), and the project's own name in the lock
becomes `{{ project_slug }}` (`{{ project_slug }}-dashboard`), so the template's uv.lock renders
right for any slug (uv compares a lock with pyproject.toml by content, not by the order of its
entries).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from testkit.project import PYTHON_VARIANTS, REPO, Variant, render, snapshot_template, variant

LOCKS = REPO / "locks"
# The edge variant's dashboard/ project, locked on its own.
EDGE_DASHBOARD = LOCKS / "edge-dashboard.uv.lock"


def lock_path(variant: Variant) -> Path:
    """Where the template's uv.lock includes it from: locks/<worker_style>-<claim_transport>."""
    return LOCKS / f"{variant.worker_style}-{variant.claim_transport}.uv.lock"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/lock", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep locked versions (no --upgrade)")
    args = parser.parse_args()
    LOCKS.mkdir(exist_ok=True)
    # A project renders its lock from these files: empty ones until the first `uv lock`.
    for python in PYTHON_VARIANTS:
        lock_path(python).touch()
    EDGE_DASHBOARD.touch()
    upgrade = [] if args.keep else ["--upgrade"]
    with tempfile.TemporaryDirectory() as tmp:
        template = snapshot_template(Path(tmp) / "template")
        for python in PYTHON_VARIANTS:
            project = render(template, Path(tmp) / str(python), **python.answers)
            relock(project, lock_path(python), "my-app", "{{ project_slug }}", upgrade)
        edge = variant("edge")
        project = render(template, Path(tmp) / str(edge), **edge.answers)
        dashboard = "{{ project_slug }}-dashboard"
        relock(project / "dashboard", EDGE_DASHBOARD, "my-app-dashboard", dashboard, upgrade)
    return 0


def relock(project: Path, dest: Path, name: str, template_name: str, upgrade: list[str]) -> None:
    """`uv lock` the rendered `project` and write its lock to `dest`, its own `name` written
    as `template_name`."""
    lock = project / "uv.lock"
    if not lock.read_text().strip():
        lock.unlink()
    command = ["uv", "lock", "--python", sys.executable, *upgrade]
    subprocess.run(command, cwd=project, check=True)
    text = lock.read_text()
    own = f'name = "{name}"'
    if text.count(own) != 1 or re.search(r"{{|{%|{#", text):
        raise SystemExit(f"{project.name}: cannot template this lock safely")
    dest.write_text(text.replace(own, f'name = "{template_name}"'))
    print(f"wrote {dest.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
