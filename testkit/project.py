"""The template and the projects it renders: snapshot the working tree, render and update
projects, run commands and the Supabase CLI in them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import copier
import jinja2
import yaml

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[1]
SUPABASE_CLI = REPO / "node_modules" / ".bin" / "supabase"

# Copier changes the process's working directory while it renders (its tasks run in the
# destination), so two renders in threads of one process would write into each other's
# folders: tests/conftest.py's `installs` renders every variant from a thread pool.
COPIER_LOCK = threading.Lock()


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


def copy_working_tree(dest: Path) -> None:
    """Copy the template repo's working tree (tracked and untracked, not ignored files)."""
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


def commit_everything(repo: Path, message: str) -> None:
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    run([*git, "add", "-A"], cwd=repo)
    run([*git, "commit", "-q", "--allow-empty", "-m", message], cwd=repo)


def snapshot_template(dest: Path) -> Path:
    """The working tree in a fresh git repo with one commit, so tests render exactly what is
    on disk."""
    copy_working_tree(dest)
    run(["git", "init", "-q", "-b", "main"], cwd=dest)
    commit_everything(dest, "snapshot")
    return dest


def snapshot_with_history(dest: Path) -> Path:
    """A clone of this repo (so every release is in it) with the working tree committed on
    top as HEAD: what `copier update` from a release to this change needs."""
    run(["git", "clone", "-q", "--no-local", REPO, dest])
    for name in run(["git", "ls-files", "-z"], cwd=dest).split("\0"):
        if name:
            (dest / name).unlink()
    copy_working_tree(dest)
    commit_everything(dest, "the working tree")
    return dest


# The template's releases, oldest first: version and commit. A release is also tagged v<version>
# where the repo carries tags, but the tests read this list, so a clone without tags (or from
# before them) tests every release the same (docs/maintainers/releases.md).
RELEASES: dict[str, str] = {
    "0.1.0": "70dac05",
    "1.0.0": "da6d237",
    "1.1.0": "cad73d8",
    "1.2.0": "d63641b",
    "1.3.0": "c5d7f43",
    "1.4.0": "fb9e3a8",
    "1.5.0": "d38daa3",
}


def release_refs(repo: Path = REPO) -> list[str]:
    """The commits of the template's releases (RELEASES), oldest first. A clone without them
    fails loudly; a v<version> tag, where there is one, must name the same commit."""
    for version, commit in RELEASES.items():
        probe = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        assert probe.returncode == 0, (
            f"release {version} ({commit}) is not in this clone of the template ({repo}): the "
            "release tests need the full history (git fetch --unshallow)"
        )
        tag = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"v{version}^{{commit}}"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        assert tag.returncode != 0 or tag.stdout == probe.stdout, (
            f"tag v{version} names another commit than release {version}'s ({commit})"
        )
    return list(RELEASES.values())


def release_version(ref: str) -> str:
    """The release a ref of release_refs() names (RELEASES, read backwards). It is what a
    project created from that release records as its queue baseline."""
    return {commit: version for version, commit in RELEASES.items()}[ref]


def _baselines() -> dict[str, list[str]]:
    """Each release's baseline migrations, as rendered and in the order they apply, read from
    the names of template/supabase/migrations (each with a condition on `queue_baseline`)."""
    condition = re.compile(
        r"^\{% if queue_baseline == '(?P<release>[\d.]+)' %\}(?P<name>.+)\{% endif %\}\.jinja$"
    )
    found: dict[str, list[str]] = {}
    for p in sorted((REPO / "template/supabase/migrations").iterdir()):
        if m := condition.match(p.name):
            found.setdefault(m["release"], []).append(m["name"])
    return {release: sorted(names) for release, names in found.items()}


def current_baseline() -> str:
    """The release whose baseline a new project gets at HEAD: the newest of the baseline
    migrations in template/. While a release is being made it is newer than every one of
    RELEASES; once cut, it is the newest of them."""
    return max(_baselines(), key=lambda v: tuple(map(int, v.split("."))))


def baseline_migrations(release: str | None = None) -> list[str]:
    """The queue migrations a project created at `release` (the current baseline by default)
    starts from, as rendered, in the order they apply: one file up to 1.2.0, a few topic files
    from 1.3.0 on."""
    return _baselines()[release or current_baseline()]


def previous_release() -> str:
    """The commit of the newest release older than HEAD's baseline: the release whose projects
    take the current release's step (1.1.0's, for 1.2.0's step)."""
    current = tuple(map(int, current_baseline().split(".")))
    older = [v for v in RELEASES if tuple(map(int, v.split("."))) < current]
    return dict(zip(RELEASES, release_refs(), strict=True))[older[-1]]


def questions() -> dict:
    """copier.yml's questions (settings starting with _ left out)."""
    data = yaml.safe_load((REPO / "copier.yml").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def choices(question: str) -> list[str]:
    """The values copier.yml offers for a question, in its order."""
    return list(questions()[question]["choices"].values())


@dataclass(frozen=True)
class Variant:
    """A kind of project the template generates: a worker style and, for the styles copier.yml
    asks it for, a claim transport."""

    worker_style: str
    claim_transport: str | None = None

    def __str__(self) -> str:
        """Its test id: python-supabase, python-http-postgres, edge, ..."""
        return "-".join(filter(None, (self.worker_style, self.claim_transport)))

    @property
    def answers(self) -> dict[str, str]:
        return {"worker_style": self.worker_style} | (
            {"claim_transport": self.claim_transport} if self.claim_transport else {}
        )

    @property
    def python(self) -> bool:
        """A Python worker (the edge worker is Deno)."""
        return self.worker_style != "edge"

    @property
    def http(self) -> bool:
        """Woken by the database's POST (python-http), rather than polling and listening."""
        return self.worker_style == "python-http"


def _variants() -> list[Variant]:
    """Each worker_style with each claim_transport where copier.yml asks for one (its `when`),
    else once."""
    asks = jinja2.Template(questions()["claim_transport"]["when"])
    found = []
    for style in choices("worker_style"):
        asked = asks.render(worker_style=style)
        assert asked in ("True", "False"), f"claim_transport's `when` rendered {asked!r}"
        transports = choices("claim_transport") if asked == "True" else [None]
        found += [Variant(style, transport) for transport in transports]
    return found


# Every variant, read from copier.yml: adding a choice there adds its tests.
VARIANTS = _variants()
PYTHON_VARIANTS = [v for v in VARIANTS if v.python]


def variant(worker_style: str, claim_transport: str | None = None) -> Variant:
    """The variant with these answers, which copier.yml must offer."""
    wanted = Variant(worker_style, claim_transport)
    if wanted not in VARIANTS:
        offered = ", ".join(map(str, VARIANTS))
        raise LookupError(f"copier.yml offers no variant {wanted} (it offers {offered})")
    return wanted


def render(template: Path, dest: Path, *, vcs_ref: str = "HEAD", **answers) -> Path:
    """Render the template (at `vcs_ref`) into dest with the defaults, overridden by answers."""
    with COPIER_LOCK:
        copier.run_copy(
            str(template),
            str(dest),
            data=answers,
            defaults=True,
            unsafe=True,
            vcs_ref=vcs_ref,
            quiet=True,
        )
    return dest


def render_repo(
    template: Path, dest: Path, message: str, *, vcs_ref: str = "HEAD", **answers
) -> Path:
    """render(), then the project as a git work tree with everything committed: what
    `copier update` needs to start from."""
    render(template, dest, vcs_ref=vcs_ref, **answers)
    run(["git", "init", "-q", "-b", "main"], cwd=dest)
    commit_everything(dest, message)
    return dest


def update(project: Path, vcs_ref: str, **answers) -> Path:
    """`copier update` a rendered project (a clean git work tree) to vcs_ref, replaying its
    answers, with answers overridden; conflicts become *.rej files the tests look for."""
    with COPIER_LOCK:
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


def record_prompts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The questions Copier puts to the user from now on, each answered with its default: a
    stand-in for questionary's prompt, which skips a question whose `when` is false."""
    asked: list[str] = []

    def prompt(questions: list[dict], answers: dict) -> dict:
        (question,) = questions
        name = question["name"]
        if question["when"](answers):
            asked.append(name)
        return {name: answers[name]}

    monkeypatch.setattr("copier._main.unsafe_prompt", prompt)
    return asked


def rendered_files(project: Path) -> list[Path]:
    return sorted(p for p in project.rglob("*") if p.is_file() and ".git" not in p.parts)


def supabase(project: Path, *args: str) -> str:
    """The real Supabase CLI, run in a rendered project."""
    return run([SUPABASE_CLI, *args], cwd=project, env={"DO_NOT_TRACK": "1"})


def push_migrations(project: Path, db_url: str) -> str:
    return supabase(project, "db", "push", "--db-url", db_url, "--yes")
