"""Helpers that carry the template tests: snapshot the template, render it, run commands."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import copier
import yaml

REPO = Path(__file__).resolve().parents[2]
SUPABASE_CLI = REPO / "node_modules" / ".bin" / "supabase"


def run(cmd: list[str | Path], cwd: Path | None = None, env: dict | None = None, **kw) -> str:
    """Run a command, fail the test with its output when it exits non-zero, return stdout."""
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        **kw,
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def snapshot_template(dest: Path) -> Path:
    """Copy the template repo's working tree (tracked and untracked, not ignored files) into a
    fresh git repo with one commit, so tests render exactly what is on disk."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    run(["git", "init", "-q", "-b", "main"], cwd=dest)
    run([*git, "add", "-A"], cwd=dest)
    run([*git, "commit", "-q", "-m", "snapshot"], cwd=dest)
    return dest


def questions() -> dict:
    """copier.yml's questions (settings starting with _ left out)."""
    data = yaml.safe_load((REPO / "copier.yml").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def render(template: Path, dest: Path, **answers) -> Path:
    """Render the template into dest with the defaults, overridden by answers."""
    copier.run_copy(
        str(template),
        str(dest),
        data=answers,
        defaults=True,
        unsafe=True,
        vcs_ref="HEAD",
        quiet=True,
    )
    return dest


def update(project: Path, vcs_ref: str, **answers) -> Path:
    """`copier update` a rendered project (a clean git work tree) to vcs_ref, replaying its
    answers, with answers overridden; conflicts become *.rej files the tests look for."""
    copier.run_update(
        str(project),
        data=answers,
        defaults=True,
        overwrite=True,
        unsafe=True,
        vcs_ref=vcs_ref,
        quiet=True,
        conflict="rej",
    )
    return project


def rendered_files(project: Path) -> list[Path]:
    return sorted(p for p in project.rglob("*") if p.is_file() and ".git" not in p.parts)


def supabase(project: Path, *args: str) -> str:
    """The real Supabase CLI, run in a rendered project."""
    return run([SUPABASE_CLI, *args], cwd=project, env={"DO_NOT_TRACK": "1"})


def push_migrations(project: Path, db_url: str) -> str:
    return supabase(project, "db", "push", "--db-url", db_url, "--yes")
