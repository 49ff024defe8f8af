"""The dashboard ships in the project's wheel (what the Dockerfile installs): its page
templates and stylesheet are package data, which an editable install would not miss."""

from __future__ import annotations

import zipfile
from pathlib import Path

from testkit.project import render, run


def test_the_wheel_carries_the_dashboards_pages(template: Path, tmp_path: Path) -> None:
    project = render(template, tmp_path / "app", worker_style="python")
    run(["uv", "build", "--wheel", "--quiet", "--out-dir", tmp_path / "dist"], cwd=project)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = project / "src"
    shipped = {
        path.relative_to(source).as_posix()
        for path in (source / "my_app" / "dashboard").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {
        "my_app/dashboard/templates/overview.html",
        "my_app/dashboard/static/dashboard.css",
    } <= shipped
    assert shipped <= names
