"""`scripts/lock`: write locks/<worker_style>-<claim_transport>.uv.lock for each Python variant.

Each variant is rendered with the default answers, `uv lock` resolves it (`--upgrade`: the
newest releases that fit template/pyproject.toml.jinja), and the project's own name in the
lock becomes `{{ project_slug }}`, so the template's uv.lock renders right for any slug (uv
compares a lock with pyproject.toml by content, not by the order of its entries).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from testkit.project import PYTHON_VARIANTS, REPO, Variant, render, snapshot_template

LOCKS = REPO / "locks"
# The default answers' project name, as uv writes it in the lock.
DEFAULT_NAME = 'name = "my-app"'


def lock_path(variant: Variant) -> Path:
    """Where the template's uv.lock includes it from: locks/<worker_style>-<claim_transport>."""
    return LOCKS / f"{variant.worker_style}-{variant.claim_transport}.uv.lock"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/lock", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep locked versions (no --upgrade)")
    args = parser.parse_args()
    LOCKS.mkdir(exist_ok=True)
    for variant in PYTHON_VARIANTS:
        # A variant renders its lock from this file: an empty one until the first `uv lock`.
        lock_path(variant).touch()
    with tempfile.TemporaryDirectory() as tmp:
        template = snapshot_template(Path(tmp) / "template")
        for variant in PYTHON_VARIANTS:
            project = render(template, Path(tmp) / str(variant), **variant.answers)
            lock = project / "uv.lock"
            if not lock.read_text().strip():
                lock.unlink()
            upgrade = [] if args.keep else ["--upgrade"]
            command = ["uv", "lock", "--python", sys.executable, *upgrade]
            subprocess.run(command, cwd=project, check=True)
            text = lock.read_text()
            if text.count(DEFAULT_NAME) != 1 or re.search(r"{{|{%|{#", text):
                raise SystemExit(f"{variant}: cannot template this lock safely")
            lock_path(variant).write_text(text.replace(DEFAULT_NAME, 'name = "{{ project_slug }}"'))
            print(f"wrote {lock_path(variant).relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
