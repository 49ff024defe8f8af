"""The rendered Edge Function: present only in the edge variant, and passing its own checks
(`deno fmt --check`, `deno lint`, `deno check`, `deno test`)."""

from __future__ import annotations

import json
import posixpath
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from testkit.project import RELEASES, choices, current_baseline, render, rendered_files
from tests.support.workflow import job_steps, run_step, runner_env

from .deno_worker import FUNCTION, Deno

# What Deno needs from the test session: its npm cache, no update check, plain output.
DENO_SETTINGS = ("DENO_DIR", "DENO_NO_UPDATE_CHECK", "NO_COLOR")


@pytest.mark.parametrize("style", choices("worker_style"))
def test_only_the_edge_style_has_a_function(template: Path, tmp_path: Path, style: str) -> None:
    project = render(template, tmp_path / "app", worker_style=style)
    config = tomllib.loads((project / "supabase" / "config.toml").read_text())
    if style == "edge":
        assert (project / "supabase" / "functions" / "job-worker" / "index.ts").is_file()
        # A wake-up carries no JWT, only its Standard Webhooks signature, so the gateway must
        # let it through; the function checks the signature itself.
        assert config["functions"] == {"job-worker": {"enabled": True, "verify_jwt": False}}
        # The jobs run after the 202: the runtime must keep the isolate after its response
        # ("oneshot", older CLIs' default, ends it there).
        assert config["edge_runtime"] == {"policy": "per_worker"}
    else:
        assert not (project / "supabase" / "functions").exists()
        assert not [p for p in rendered_files(project) if p.suffix == ".ts"]
        assert "functions" not in config
        assert "edge_runtime" not in config


@pytest.mark.quick
def test_edge_function_layout(function_dir: Path) -> None:
    files = {p.relative_to(function_dir).as_posix() for p in rendered_files(function_dir)}
    assert {
        "README.md",
        "index.ts",
        "deno.json",
        "handlers/mod.ts",
        "handlers/send_email.ts",
        "handlers/send_webhook.ts",
        # the test helpers for the user's own tests, and the tests that show them failing
        "testing_run.ts",
        "testing_enqueue.ts",
        "testing_test.ts",
        # and those against a database, with the tests that use them there
        "testing_drain.ts",
        "testing_clock.ts",
        "db_tests/handlers_test.ts",
    } <= files
    # One module per job kind, each with its tests, and all of them in the handler map.
    handler_map = (function_dir / "handlers" / "mod.ts").read_text()
    for kind in ("send_email", "send_webhook"):
        assert f"handlers/{kind}_test.ts" in files
        assert f'from "./{kind}.ts"' in handler_map
        # the generated tests run each handler as the worker would, with the test helper
        assert f'runJob("{kind}"' in (function_dir / "handlers" / f"{kind}_test.ts").read_text()
    assert not [f for f in files if f.endswith(".jinja")]


def test_edge_function_imports_only_pinned_npm_packages(function_dir: Path) -> None:
    config = json.loads((function_dir / "deno.json").read_text())
    for name, target in config["imports"].items():
        assert re.fullmatch(r"npm:(@[\w.-]+/)?[\w.-]+@\d+\.\d+\.\d+", target), (name, target)
    # No deno.lock: Supabase CLIs older than early 2026 refuse to bundle a function next to
    # the lockfile v5 that Deno 2.2+ writes; the exact versions above pin it instead.
    assert config["lock"] is False
    # Every import statement (also one spread over lines, or with only a side effect), and
    # dynamic imports: local modules, node: built-ins, or a name from the import map.
    statement = re.compile(
        r'^(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)"|^import\s*"([^"]+)"|\bimport\(\s*"([^"]+)"',
        re.M,
    )
    specifiers = {
        source.relative_to(function_dir).as_posix(): [
            "".join(groups) for groups in statement.findall(source.read_text())
        ]
        for source in function_dir.rglob("*.ts")
    }
    assert "@supabase/supabase-js" in specifiers["data_api.ts"]
    assert "zod" in specifiers["job.ts"]
    for source, imported in specifiers.items():
        for specifier in imported:
            local = specifier.startswith(("./", "../", "node:"))
            assert local or specifier in config["imports"], f"{source} imports {specifier}"
    # The Postgres driver is for the tests against a database (queueClock) alone: nothing the
    # function runs, from index.ts on, imports it, so it is never deployed.
    assert "postgres" in specifiers["testing_clock.ts"]
    deployed, reached = {"index.ts"}, ["index.ts"]
    while reached:
        importer = reached.pop()
        for specifier in specifiers[importer]:
            assert specifier != "postgres", f"{importer}, which the function runs, imports it"
            if specifier.startswith(("./", "../")):
                folder = posixpath.dirname(importer)
                module = posixpath.normpath(posixpath.join(folder, specifier))
                if module not in deployed:
                    deployed.add(module)
                    reached.append(module)
    assert {"worker.ts", "data_api.ts", "handlers/send_email.ts"} <= deployed
    assert not {m for m in deployed if m.startswith("testing")}, deployed


@pytest.mark.quick
def test_rendered_function_passes_its_own_checks(
    deno: Deno, edge_project: Path, function_dir: Path
) -> None:
    """As the project's CI workflow runs them (its edge-function job's steps, as written), with
    no setting of ours in the environment: the tests need no wake-up secret."""
    job = job_steps(edge_project, "edge-function")
    steps = [step["run"] for step in job if "run" in step]
    assert steps == ["deno fmt --check", "deno lint", "deno check .", "deno task test"]
    env = runner_env([Path(deno.binary).parent], **{k: deno.env()[k] for k in DENO_SETTINGS})
    assert not {k for k in env if k.startswith(("SUPABASE_", "PGQUEUE_"))}
    for script in steps:
        done = run_step(script, function_dir, env)
        assert done.returncode == 0, f"{script}:\n{done.stdout}\n{done.stderr}"
    match = re.search(r"ok \| (\d+) passed \| 0 failed", done.stdout + done.stderr)
    assert match and int(match[1]) >= 20, done.stdout


def test_the_readmes_queue_client_example_type_checks(
    deno: Deno, function_dir: Path, tmp_path: Path
) -> None:
    # As another function next to this one would hold it.
    functions = tmp_path / "functions"
    shutil.copytree(function_dir, functions / FUNCTION)
    readme = (function_dir / "README.md").read_text()
    example = re.search(r"^## The queue client\n.*?^```ts\n(.*?)^```", readme, re.S | re.M)
    assert example, "the README has no queue client example"
    (functions / "example").mkdir()
    (functions / "example" / "index.ts").write_text(example[1])
    deno.run("check", "--config", f"{FUNCTION}/deno.json", "example/index.ts", cwd=functions)


def test_answers_reach_the_function(template: Path, tmp_path: Path, deno: Deno) -> None:
    project = render(
        template,
        tmp_path / "app",
        worker_style="edge",
        edge_function_name="jobs-runner",
        queue_schema="background_jobs",
        lease_seconds=45,
    )
    function_dir = project / "supabase" / "functions" / "jobs-runner"
    settings = (function_dir / "settings.ts").read_text()
    assert 'export const FUNCTION_NAME = "jobs-runner";' in settings
    assert 'const DEFAULT_SCHEMA = "background_jobs";' in settings
    # The database's lease (its config table) is not the function's: its claims ask for a
    # short one of their own (PGQUEUE_LEASE_SECONDS), renewed while their jobs run.
    assert "45" not in settings
    assert "const DEFAULT_LEASE_SECONDS = 60;" in settings
    deno.run("fmt", "--check", cwd=function_dir)
    deno.run("lint", cwd=function_dir)


@pytest.mark.parametrize("baseline", sorted({*RELEASES, current_baseline()}))
def test_the_functions_readme_names_only_migrations_the_project_has(
    template: Path, tmp_path: Path, baseline: str
) -> None:
    """Every migration file name or glob the function's README names matches a file of the
    project, whichever release it was created at: never a release's file that goes stale."""
    project = render(template, tmp_path / "app", worker_style="edge", queue_baseline=baseline)
    readme = (project / "supabase" / "functions" / FUNCTION / "README.md").read_text()
    named = set(re.findall(r"`([^`\s]*\.sql)`", readme))
    assert named, "the function's README points at no migration"
    for name in named:
        pattern = name if name.startswith("supabase/") else f"supabase/migrations/{name}"
        assert list(project.glob(pattern)), f"the README names {name}: no such file in {baseline}"
