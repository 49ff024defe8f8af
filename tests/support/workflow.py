"""A generated project's CI workflow (.github/workflows/ci.yml), its `run:` steps run here as
GitHub's runner runs them: `bash --noprofile --norc -eo pipefail`, in the project's folder.

The only command they call that cannot run here is `supabase status -o env` (the local stack
runs in Docker): `supabase_status()` puts in its place a `supabase` that prints our stack's
variables in the CLI's `NAME="value"` lines, and refuses any other call. Everything else the
steps call (uv, pytest, the project's code) is the real thing."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import yaml


def job_steps(project: Path, job: str) -> list[dict]:
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    return workflow["jobs"][job]["steps"]


def step(project: Path, job: str, name: str) -> str:
    """The `run:` script of the step of `job` whose name starts with `name`."""
    [found] = [s for s in job_steps(project, job) if s.get("name", "").startswith(name)]
    return found["run"]


def supabase_status(bin_dir: Path, variables: dict[str, str]) -> Path:
    """A `supabase` in bin_dir that answers `status -o env` with `variables`, as the CLI
    prints them; bin_dir, to put first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    assert all('"' not in value and "$" not in value for value in variables.values())
    lines = "".join(f'{name}="{value}"\n' for name, value in variables.items())
    script = bin_dir / "supabase"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$*" = "status -o env" ]; then\n'
        f"  cat <<'EOF'\n{lines}EOF\n"
        "  exit 0\n"
        "fi\n"
        'echo "this stand-in only answers supabase status -o env, not: $*" >&2\n'
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def run_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a step's script with exactly `env` (nothing inherited); its output for the test."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# What a project's settings are named: none of them may reach a step from our environment.
PROJECT_SETTINGS = ("SUPABASE_", "PGQUEUE_", "WAKE_SECRET", "METRICS_TOKEN", "DASHBOARD_")
STACK = ("API_URL", "DB_URL", "DATABASE_URL", "SERVICE_ROLE_KEY", "ANON_KEY", "JWT_SECRET")


def runner_env(path: list[Path], **extra: str) -> dict[str, str]:
    """A CI runner's environment, as this machine's: the given folders first on PATH, and no
    variable a project reads (no stack, no WAKE_SECRET) but those in `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(PROJECT_SETTINGS) and k not in STACK and not k.startswith("WORKER_")
    }
    search = os.pathsep.join([*map(str, path), os.environ["PATH"]])
    return {**env, "PATH": search, **extra}
