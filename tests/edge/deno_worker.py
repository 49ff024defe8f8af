"""Deno from PyPI, and the rendered Edge Function run with it as a local process."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from testkit.postgrest import PostgRESTStandIn, make_jwt
from tests.support.wake_signing import secret_for

FUNCTION = "job-worker"
# Preloaded to give the function the Edge runtime's EdgeRuntime.waitUntil().
EDGE_RUNTIME = Path(__file__).with_name("edge_runtime.ts")
# Settings the worker reads; the outer environment must not leak into the function's.
WORKER_ENV_PREFIXES = ("SUPABASE_", "PGQUEUE_", "DENO_SERVE_ADDRESS")


def register_handler(function: Path, import_line: str, entry: str) -> None:
    """Register a handler in a copy of the rendered function, as the generated README says:
    `import_line` on top of handlers/mod.ts and `entry` (`"probe"`, `"export_data:
    exportData"`) first in its handler map."""
    handler_map = function / "handlers" / "mod.ts"
    entries = "export const handlers = {\n"
    assert entries in handler_map.read_text(), "handlers/mod.ts changed shape: update this"
    handler_map.write_text(
        f"{import_line}\n" + handler_map.read_text().replace(entries, f"{entries}  {entry},\n")
    )


@dataclass
class Deno:
    """The Deno binary from PyPI's `deno` package, with one npm cache for the whole session."""

    binary: str
    cache: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(WORKER_ENV_PREFIXES)}
        return env | {
            "DENO_DIR": str(self.cache),
            "DENO_NO_UPDATE_CHECK": "1",
            "NO_COLOR": "1",
            **extra,
        }

    def run(self, *args: str, cwd: Path, timeout: float = 180) -> str:
        """Run a deno command; fail the test with its output when it exits non-zero."""
        proc = subprocess.run(
            [self.binary, *args],
            cwd=cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, (
            f"deno {' '.join(args)} exited {proc.returncode} in {cwd}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
        return proc.stdout + proc.stderr


# The wake-up secret the function runs with in tests (`supabase secrets set` on a project),
# base64 as Standard Webhooks reads the secret wake-ups are signed with.
EDGE_WAKE_SECRET = secret_for("edge-wake-secret-of-the-tests-0123456789")


@dataclass
class EdgeWorker:
    """The rendered function's own index.ts, served by `deno run` on 127.0.0.1."""

    process: subprocess.Popen
    url: str
    key: str  # its service key: the Data API's and the metrics'
    wake_secret: str  # what its wake-ups are signed with
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def output(self) -> str:
        return "\n".join(self.lines)

    def events(self) -> list[dict]:
        """The JSON lines it has logged."""
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def wait_for_exit(self, timeout: float = 20) -> int:
        """Wait for the process to end by itself and its output to be read; its exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the function did not end:\n{self.output()}") from None
        if self.reader is not None:
            self.reader.join(timeout=5)
        return code


def start_edge_worker(
    deno: Deno,
    function_dir: Path,
    api: PostgRESTStandIn,
    *,
    edge_runtime: bool = False,
    **settings: str,
) -> EdgeWorker:
    """Start index.ts with the environment the Edge runtime gives it, pointed at `api`.

    With `edge_runtime`, EdgeRuntime.waitUntil() is there too (edge_runtime.ts), and the
    process ends, as the platform may end the function, once the work handed to it settles.
    Without it, the work simply goes on, and so does the process."""
    key = make_jwt("service_role")
    env = deno.env(
        SUPABASE_URL=api.url,
        SUPABASE_SERVICE_ROLE_KEY=key,
        PGQUEUE_WAKE_SECRET=EDGE_WAKE_SECRET,
        # Deno.serve() in index.ts listens where this says (port 0: any free port).
        DENO_SERVE_ADDRESS="tcp:127.0.0.1:0",
        **settings,
    )
    process = subprocess.Popen(
        [
            deno.binary,
            "run",
            "--allow-net=127.0.0.1",
            "--allow-env",
            *(["--preload", str(EDGE_RUNTIME)] if edge_runtime else []),
            "index.ts",
        ],
        cwd=function_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return listening_worker(process, key)


def listening_worker(process: subprocess.Popen, key: str) -> EdgeWorker:
    """The function started as `process` (its output piped, stderr into stdout), once it
    listens; its output is read as it comes. `key` is its service key."""
    worker = EdgeWorker(process, url="", key=key, wake_secret=EDGE_WAKE_SECRET)
    listening: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            worker.lines.append(line.rstrip("\n"))
            if line.startswith("Listening on "):
                listening.put(line.split()[-1])

    worker.reader = threading.Thread(target=read, name="deno output", daemon=True)
    worker.reader.start()
    deadline = time.monotonic() + 120  # the first run downloads the npm packages
    while not worker.url:
        try:
            worker.url = listening.get(timeout=0.2).rstrip("/") + f"/{FUNCTION}"
        except queue.Empty:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the edge worker did not start:\n{worker.output()}") from None
    return worker


def run_queue_client(
    deno: Deno, function_dir: Path, api: PostgRESTStandIn, calls: list[list]
) -> list[dict]:
    """Make `calls` ([method, *args] each) with the function's queue client (queue_client.ts,
    in a copy of the function), against `api`; each call's answer, {"ok": ...} or
    {"error": {...}}."""
    proc = subprocess.run(
        [deno.binary, "run", "--allow-net=127.0.0.1", "--allow-env", "queue_client.ts"],
        cwd=function_dir,
        env=deno.env(
            SUPABASE_URL=api.url,
            SUPABASE_SERVICE_ROLE_KEY=make_jwt("service_role"),
            # the function's settings, which its queue client reads, need one
            PGQUEUE_WAKE_SECRET=EDGE_WAKE_SECRET,
        ),
        input="".join(json.dumps(call) + "\n" for call in calls),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"queue_client.ts exited {proc.returncode}:\n{proc.stderr}"
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(calls), proc.stdout + proc.stderr
    return answers


def stop_edge_worker(worker: EdgeWorker) -> None:
    worker.process.terminate()
    try:
        worker.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        worker.process.kill()
        worker.process.wait()


class SlowReceiver:
    """A webhook receiver on 127.0.0.1 that takes `delay` seconds to answer 200."""

    def __init__(self, delay: float) -> None:
        self.hits = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(delay)
                receiver.hits += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> SlowReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
