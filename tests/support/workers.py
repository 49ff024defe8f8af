"""Worker processes of rendered projects: each variant installed as its README says, or run
from its src/ on pytest's interpreter, with test handlers added the way a user adds one;
processes that are killed whatever happens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from testkit.cluster import free_port
from testkit.project import PYTHON_VARIANTS, Variant, render, run
from testkit.stack import point_wake_ups

from .jobs import wait_until

# The python style once per claim transport, for the `installed` fixture (tests/worker): for
# what both python styles run through the same code, where once per transport is enough.
each_transport = pytest.mark.parametrize(
    "installed",
    [v for v in PYTHON_VARIANTS if v.worker_style == "python"],
    indirect=True,
    ids=str,
)

PACKAGE = "my_app"  # the default answers' package name
SCRIPT = "my-app"  # ... and console script

# Handler modules the tests add to a copy of a rendered project's src/, the way a user adds
# one: a module in handlers/.
HANDLERS = Path(__file__).parent / "handlers"
# The handler the end-to-end tests drive: it appends a line per run to a file, and sleeps or
# raises when the payload says so.
PROBE = HANDLERS / "e2e_probe.py"
# The probe's handler again, for a kind with its own Backoff.
PROBE_BACKOFF = HANDLERS / "e2e_probe_backoff.py"
# A workflow's step (tests/worker/test_worker_workflows.py): records what its dependencies
# returned.
WORKFLOW_STEP = HANDLERS / "e2e_workflow.py"


# The kind the second service of the shared-queue test handles (and the first does not).
OTHER_KIND = "e2e_other"


@dataclass
class Installed:
    """A rendered project and the venv its workers run in: its own, made as its README says
    (`uv sync --locked --extra dev`, see install()), or the `interpreter` fixture's."""

    variant: Variant
    path: Path
    venv: Path
    # the src/ its worker processes run from: a copy of the project's with test handlers added
    src: Path

    @property
    def http(self) -> bool:
        return self.variant.http

    @property
    def transport(self) -> str | None:
        return self.variant.claim_transport

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def install(template: Path, root: Path, variant: Variant) -> Installed:
    path = render(template, root / "project", **variant.answers)
    venv = root / "venv"
    # --locked: the committed uv.lock must match the variant's pyproject.toml as rendered.
    run(
        ["uv", "sync", "--locked", "--extra", "dev", "--python", sys.executable, "--no-progress"],
        cwd=path,
        env={"UV_PROJECT_ENVIRONMENT": str(venv)},
    )
    src = with_handlers(path / "src", root / "e2e" / "src", PROBE, PROBE_BACKOFF, WORKFLOW_STEP)
    return Installed(variant, path, venv, src)


def with_handlers(src: Path, dest: Path, *modules: Path) -> Path:
    """A copy of a project's src/ at `dest`, with handler modules added to its handlers/."""
    shutil.copytree(src, dest)
    for module in modules:
        shutil.copy(module, dest / PACKAGE / "handlers" / module.name)
    return dest


def other_service(installed: Installed, root: Path) -> Path:
    """src/ of another service on the same queue: this project with its handlers replaced by
    one for OTHER_KIND (the probe under another name)."""
    src = root / "other-service" / "src"
    shutil.copytree(installed.path / "src", src)
    handlers = src / PACKAGE / "handlers"
    for module in handlers.glob("send_*.py"):
        module.unlink()
    probe = PROBE.read_text()
    other = probe.replace('@handler("e2e_probe"', f'@handler("{OTHER_KIND}"')
    assert other != probe
    (handlers / f"{OTHER_KIND}.py").write_text(other)
    return src


class WorkerProcess:
    """`python -m my_app worker` of an installed variant, its output in a file."""

    def __init__(
        self, installed: Installed, env: dict[str, str], log: Path, src: Path | None = None
    ) -> None:
        self.port = int(env["PORT"]) if installed.http else None
        # GET /health shows whether the worker is draining only to a bearer of WAKE_SECRET
        self.health_headers = {"Authorization": f"Bearer {env.get('WAKE_SECRET', '')}"}
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [installed.bin("python"), "-m", PACKAGE, "worker"],
            env={**os.environ, **env, "PYTHONPATH": str(src or installed.src)},
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text()

    def events(self, event: str) -> list[dict]:
        lines = [json.loads(line) for line in self.output().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == event]

    def wait_ready(self, timeout: float = 30) -> None:
        """Until the worker is idle: started and (HTTP) done with its start-up drain."""

        def ready() -> bool:
            assert self.proc.poll() is None, f"the worker exited early:\n{self.output()}"
            if self.port is None:
                return bool(self.events("worker.start"))
            try:
                health = httpx.get(f"{self.url}/health", headers=self.health_headers, timeout=1)
                return not health.json()["draining"]
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, what="the worker to start")
        if self.port is None:
            time.sleep(0.3)  # past its first, empty claim

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit within {timeout}s:\n{self.output()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log_file.close()


@dataclass
class Workers:
    """Starts worker processes of one variant; the fixture kills every one at teardown."""

    installed: Installed
    env: dict[str, str]
    tmp_path: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(
        self, ready: bool = True, src: Path | None = None, **settings: object
    ) -> WorkerProcess:
        """A worker process (of another service when `src` is given: see other_service())."""
        env = {**self.env, **{k: str(v) for k, v in settings.items()}}
        if self.installed.http:
            env |= {"HOST": "127.0.0.1", "PORT": str(free_port())}
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        worker = WorkerProcess(self.installed, env, log, src)
        self.started.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def start_woken(self, db: psycopg.Connection, key: str, **settings: object) -> WorkerProcess:
        """A worker process, as start(); an HTTP one also gets this session's wake-ups."""
        worker = self.start(**settings)
        if self.installed.http:
            wake_to(db, worker, key)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


def wake_to(db: psycopg.Connection, worker: WorkerProcess, key: str) -> None:
    """Point this session's wake-ups (the enqueue trigger, sweep) at `worker`: what
    `alter database postgres set ...` does for a self-hosted project, for one session."""
    point_wake_ups(db, f"{worker.url}/wake", key)
