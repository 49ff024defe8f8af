"""Rendering: every variant from copier.yml renders cleanly, with no template residue (see
tests/support/residue.py); bad answers are refused with a message that says what is wrong."""

from __future__ import annotations

import ast
import contextlib
import re
import tomllib
from pathlib import Path

import copier
import psycopg
import pytest
import yaml
from psycopg import sql

from testkit.cluster import Cluster
from testkit.project import (
    COPIER_LOCK,
    REPO,
    VARIANTS,
    Variant,
    baseline_migrations,
    choices,
    current_baseline,
    questions,
    record_prompts,
    render,
    rendered_files,
    run,
)
from tests.support.residue import residue

# "}}" alone is ordinary JSON; a leftover Jinja expression or tag always has an opening.
JINJA_LEFTOVER = re.compile(r"{{|{%|%}|{#")


def is_jinja_of_the_project(path: Path) -> bool:
    """The dashboard's page templates: Jinja that the project itself renders."""
    return path.suffix == ".html" and path.parent.match("dashboard/templates")


def assert_clean(project: Path, *, wrapping: bool = True) -> None:
    files = rendered_files(project)
    assert files
    leftovers = [
        f"{path.relative_to(project)}:{n}: {line.strip()}"
        for path in files
        if not path.name.endswith(".yml") and not is_jinja_of_the_project(path)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if JINJA_LEFTOVER.search(line)
    ]
    assert leftovers == [], "leftover Jinja in rendered files"
    assert not [p for p in files if p.suffix in (".jinja", ".rej", ".orig")]
    assert residue(project, wrapping=wrapping) == []
    run(["ruff", "check", "."], cwd=project)
    run(["ruff", "format", "--check", "."], cwd=project)


# STYLE.md's sizes for generated code: modules up to 400 lines, functions up to 60, in Python
# and in the Edge Function's TypeScript; the user's handlers (handlers/) are theirs to shape.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# TypeScript has no parser here (neither Deno nor this venv prints a syntax tree), but the Edge
# Function is `deno fmt`ed (its own checks fail otherwise), so a function with a block body
# ends at the first line after its opening brace that is back at its head's indentation: its
# closing brace. Heads are function declarations, arrow functions assigned to a name,
# Deno.test() bodies, and members of a class (one indentation step inside it).
TS_FUNCTION_HEAD = re.compile(
    r"(?P<indent> *)(?:export )?(?:default )?(?:async )?"
    r"(?:function\b|Deno\.test\(|(?:const|let) [\w$]+(?:: [^=]+)? = (?:async )?(?:\(|[\w$]+ =>))"
)
TS_MEMBER_HEAD = re.compile(
    r"(?P<indent> *)(?:(?:public|private|protected|static|readonly|override|async|get|set) )*"
    r"[#\w$]+(?:<[^=]*>)?(?:\(|(?:: [^=]+)? = (?:async )?(?:\(|[\w$]+ =>))"
)
TS_CLASS_HEAD = re.compile(r"(?P<indent> *)(?:export )?(?:default )?(?:abstract )?class\b")
TS_BLOCK_END = re.compile(r"\}[);,]*")


def indentation(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def ts_function_lengths(text: str) -> list[tuple[int, int]]:
    """(first line, length) of each TypeScript function with a block body in `text`."""
    lines = text.splitlines()
    classes: list[int] = []  # the indentation of each class we are inside
    found = []
    for i, line in enumerate(lines):
        if classes and line == " " * classes[-1] + "}":
            classes.pop()
        if head := TS_CLASS_HEAD.match(line):
            classes.append(len(head["indent"]))
            continue
        head = TS_FUNCTION_HEAD.match(line)
        if head is None and classes:
            head = TS_MEMBER_HEAD.match(line)
            if head is not None and len(head["indent"]) != classes[-1] + 2:
                head = None
        if head is None:
            continue
        indent = len(head["indent"])
        body = i  # the signature may run on over lines until the body's opening brace
        while not lines[body].endswith("{"):
            body += 1
            if body == len(lines) or (
                lines[body].strip()
                and indentation(lines[body]) <= indent
                and not lines[body].lstrip().startswith((")", "}"))
            ):
                break  # an expression body: no block to measure
        else:
            for j in range(body + 1, len(lines)):
                if lines[j].strip() and indentation(lines[j]) <= indent:
                    if indentation(lines[j]) == indent and TS_BLOCK_END.fullmatch(lines[j].strip()):
                        found.append((i + 1, j - i + 1))
                    break
    return found


def oversized(project: Path) -> list[str]:
    """The Python and TypeScript modules over MAX_MODULE_LINES and their functions over
    MAX_FUNCTION_LINES in a rendered project, handlers/ left out."""
    found = []
    for path in sorted([*project.rglob("*.py"), *project.rglob("*.ts")]):
        name = path.relative_to(project)
        if "handlers" in name.parts or "node_modules" in name.parts:
            continue
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        if path.suffix == ".ts":
            for first, length in ts_function_lengths(text):
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{first}: a function of {length} lines")
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno}: {node.name}() is {length} lines")
    return found


@pytest.mark.quick
def test_oversized_finds_long_modules_and_functions_outside_handlers(tmp_path: Path) -> None:
    long_function = "def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    (tmp_path / "src" / "handlers").mkdir(parents=True)
    (tmp_path / "src" / "worker.py").write_text(long_function)
    (tmp_path / "src" / "handlers" / "mine.py").write_text(long_function)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_it.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "drain.ts").write_text("const x = 1;\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "worker" / "report.ts").write_text("const x = 1;\n" * MAX_MODULE_LINES)
    assert oversized(tmp_path) == [
        f"src/worker.py:1: long() is {MAX_FUNCTION_LINES + 1} lines",
        f"tests/test_it.py: {MAX_MODULE_LINES + 1} lines",
        f"worker/drain.ts: {MAX_MODULE_LINES + 1} lines",
    ]


@pytest.mark.quick
def test_typescript_functions_are_measured_from_head_to_closing_brace() -> None:
    body = "  x += 1;\n"
    source = (
        "import { z } from 'zod';\n"  # 1
        f"export async function drain(\n  queue: string,\n): Promise<void> {{\n{body * 3}}}\n"
        "const short = (n: number) => n + 1;\n"  # 9: an expression body
        f"const sum = async (n: number) => {{\n{body * 2}}};\n"  # 10
        "export class Drains {\n"
        "  private current = 0;\n"
        "  now = (): number => this.current;\n"
        f"  wakeUp(): void {{\n  {body}    if (x) {{\n    }}\n  }}\n"  # 17
        f"  private async begin(\n    wake: string,\n  ): Promise<void> {{\n  {body}  }}\n"  # 22
        "}\n"
        f'Deno.test("a drain", async () => {{\n{body}}});\n'  # 28
        "call(\n  1,\n);\n"
    )
    assert ts_function_lengths(source) == [(2, 7), (10, 4), (17, 5), (22, 5), (28, 3)]


# Every variant has Python: the worker and its tests, or (edge) the dashboard's package, and
# the Edge Function's TypeScript with it.
@pytest.mark.quick
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_generated_code_keeps_to_small_modules_and_functions(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    assert list(project.rglob("*.py")), "a variant without Python: nothing to check"
    assert bool(list(project.rglob("*.ts"))) == (not variant.python)
    assert oversized(project) == []


@pytest.mark.quick
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_every_variant_renders_cleanly(template: Path, tmp_path: Path, variant: Variant) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    assert_clean(project)
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert recorded["worker_style"] == variant.worker_style
    assert recorded.get("claim_transport") == variant.claim_transport
    assert recorded["_commit"]
    migrations = sorted((project / "supabase/migrations").glob("*.sql"))
    stamps = [m.name[:14] for m in migrations]
    assert all(s.isdigit() and m.name[14] == "_" for s, m in zip(stamps, migrations, strict=True))
    assert [m.name for m in migrations] == baseline_migrations(), "the baseline, in order"
    assert recorded["_queue_baseline"] == current_baseline()


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_each_variant_ships_only_its_own_tooling(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    hooks = {
        hook["id"]
        for repo in yaml.safe_load((project / ".pre-commit-config.yaml").read_text())["repos"]
        for hook in repo["hooks"]
    }
    workflow = (project / ".github/workflows/ci.yml").read_text()
    if not variant.python:
        assert not (project / "pyproject.toml").exists(), "no Python to configure"
        assert not (project / "uv.lock").exists()
        assert {"deno-fmt", "deno-lint", "deno-check"} <= hooks
        assert not {h for h in hooks if h.startswith(("ruff", "mypy"))}
        assert "Python" not in (project / ".gitignore").read_text()
        # uv serves the dashboard's own job only (dashboard/ is a Python project)
        jobs = yaml.safe_load(workflow)["jobs"]
        assert jobs["dashboard"]["defaults"]["run"]["working-directory"] == "dashboard"
        assert not [job for name, job in jobs.items() if name != "dashboard" and "uv " in str(job)]
    else:
        pyproject = tomllib.loads((project / "pyproject.toml").read_text())
        assert pyproject["tool"]["mypy"]["strict"] is True
        lock = tomllib.loads((project / "uv.lock").read_text())
        [own] = [p for p in lock["package"] if p["source"] == {"editable": "."}]
        assert own["name"] == pyproject["project"]["name"] == "my-app"
        assert {"ruff-check", "ruff-format", "mypy"} <= hooks
        assert not {h for h in hooks if h.startswith("deno")}
        assert "astral-sh/setup-uv@" in workflow and "uv sync --locked" in workflow
        assert "pip install" not in workflow


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_readme_describes_only_its_variant(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    readme = (render(template, tmp_path / "app", **variant.answers) / "README.md").read_text()
    style, transport = variant.worker_style, variant.claim_transport
    wakes_by_post = style != "python"
    assert ("## The wake-up URL and secret" in readme) == wakes_by_post
    assert ("pg_net POST" in readme) == wakes_by_post
    assert (":8000/wake" in readme) == (style == "python-http")
    assert ("/functions/v1/" in readme) == (style == "edge")
    # the postgres transport waits on LISTEN when idle (python) or while it lingers (python-http)
    assert ("LISTEN" in readme) == (transport == "postgres")
    assert ("uv sync" in readme) == (style != "edge")
    exposes_the_queue = "add `pgqueue` under **Project Settings > Data API > Exposed schemas**"
    assert (exposes_the_queue in readme) == (style == "edge" or transport == "supabase")
    steps = re.findall(r"^(\d)\. ", readme.split("## Setting up")[1].split("\n## ")[0], re.M)
    assert steps == [str(n) for n in range(1, len(steps) + 1)], "setup steps numbered in order"


def test_non_default_answers_reach_every_file(template: Path, tmp_path: Path) -> None:
    project = render(
        template,
        tmp_path / "billing",
        project_name="Billing Jobs",
        queue_schema="billing_q",
        service_key_setting="billing.key",
        worker_url_setting="billing.url",
        worker_style="python-http",
        worker_url="https://worker.example.com/wake",
    )
    assert_clean(project, wrapping=False)  # prose is wrapped for the default answers
    config = (project / "supabase/config.toml").read_text()
    assert 'schemas = ["public", "graphql_public", "billing_q", "billing_q_public"]' in config
    assert 'project_id = "billing-jobs"' in config
    sql = "\n".join(p.read_text() for p in (project / "supabase").rglob("*.sql"))
    # Metric names start with pgqueue_ whatever the schema (docs/observability.md lists them).
    metrics = set(re.findall(r"`(pgqueue_\w+)`", (REPO / "docs/observability.md").read_text()))
    sql = re.sub(r"\bpgqueue_\w+", lambda m: "" if m[0] in metrics else m[0], sql)
    assert not re.search(r"\bpgqueue[._]|'pgqueue", sql), "the default schema name leaked"
    assert "billing_q.jobs" in sql and "'billing_q_wake_secret'" in sql
    # the setting names seed the config row, which wake() and health() read at run time
    assert "'billing.url', 'billing.key', '* * * * *'," in sql
    assert "'https://worker.example.com/wake'" in sql


BAD_ANSWERS = [
    ("queue_schema", "x; drop table jobs", "plain SQL identifier"),
    ("queue_schema", "Jobs", "plain SQL identifier"),
    ("queue_schema", "public", "is reserved by Postgres or Supabase"),
    ("queue_schema", "pg_jobs", "is reserved by Postgres or Supabase"),
    ("queue_schema", "plpgsql", "a prefix PostgreSQL reserves"),
    ("project_slug", "../evil", "must start with a lowercase letter"),
    ("project_slug", "My App", "must start with a lowercase letter"),
    ("package_name", "my-app", "lowercase Python identifier"),
    ("package_name", "import", "is a Python keyword or shadows a module the worker imports"),
    ("project_name", "", "must not be empty"),
    ("project_name", 'x"; rm -rf /', "must not contain quotes"),
    ("worker_url", "http://x/'; drop table pgqueue.jobs; --", "http:// or https:// URL"),
    ("worker_url", "ftp://example.com/wake", "http:// or https:// URL"),
    ("worker_url", "http://user:pass@example.com/wake", "http:// or https:// URL"),
    ("worker_url", "https://example.com/wake?key=secret", "http:// or https:// URL"),
    ("worker_url", "http://169.254.169.254/latest/meta-data/", "link-local address or a cloud"),
    ("worker_url", "http://metadata.google.internal/computeMetadata/v1/", "cloud metadata"),
    ("worker_url", "http://100.100.100.200/latest/meta-data/", "cloud metadata service"),
    ("worker_url", "http://2852039166/wake", "IPv4 address written as four decimal numbers"),
    ("worker_url", "http://0251.0376.0251.0376/wake", "written as four decimal numbers"),
    ("service_key_setting", "service_role_key", "two lowercase identifiers joined by a dot"),
    ("service_key_setting", "vault.getkey_script", "belongs to an extension"),
    ("service_key_setting", "pgsodium.getkey_script", "belongs to an extension"),
    ("worker_url_setting", "pg_net.batch_size", "belongs to an extension"),
    ("worker_url_setting", "request.jwt", "belongs to an extension or to the Data API"),
    ("service_key_setting", "app.key'; select 1", "two lowercase identifiers"),
    ("service_key_setting", "app.pgqueue_worker_url", "must be different"),
    ("worker_url_setting", "url", "two lowercase identifiers joined by a dot"),
    ("max_attempts", 0, "between 1 and 100"),
    ("max_attempts", "abc", 'a whole number between 1 and 100; got "abc"'),
    ("max_attempts", 2.5, "a whole number between 1 and 100; got 2.5"),
    ("lease_seconds", "5m", 'a whole number of seconds between 10 and 86400 (one day); got "5m"'),
    ("retention_days", "a week", 'a whole number of days between 1 and 3650; got "a week"'),
    ("lease_seconds", 5, "between 10 and"),
    ("sweep_schedule", "30 seconds", "five cron fields"),
    ("sweep_schedule", "* * * *", "five cron fields"),
    ("sweep_schedule", "* * * * *'; drop", "five cron fields"),
    ("retention_days", 0, "between 1 and"),
    ("worker_style", "celery", f"'celery' is not in {choices('worker_style')}"),
    ("edge_function_name", "Job_Worker", "lowercase letters, digits and single dashes"),
]


@pytest.mark.parametrize(
    ("question", "value", "message"),
    BAD_ANSWERS,
    ids=[f"{q}={v!r}" for q, v, _ in BAD_ANSWERS],
)
def test_bad_answers_are_refused_with_a_message(
    template: Path, tmp_path: Path, question: str, value: object, message: str
) -> None:
    extra = {"worker_style": "edge"} if question == "edge_function_name" else {}
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        render(template, tmp_path / "app", **extra, **{question: value})
    assert question in str(refused.value)
    assert not (tmp_path / "app" / "supabase").exists(), "nothing is rendered for a bad answer"


def reserved_setting_prefixes(stack: Cluster) -> list[str]:
    """The setting prefixes reserved on the test cluster (as on a Supabase database, pg_cron,
    pg_net and Vault preloaded) once every library it has is loaded, as a database loads
    them on first use (plpgsql by any PL/pgSQL function): of every library's and available
    extension's name that could be a schema's, those under which set_config() refuses a
    setting, as it would refuse the queue's `<schema>.claim_front`."""
    libdir = Path(run(["pg_config", "--pkglibdir"], cwd=REPO).strip())
    names = {path.stem for path in libdir.glob("*.so")}
    reserved = []
    with stack.connect(autocommit=True) as conn:
        names |= {row[0] for row in conn.execute("select name from pg_available_extensions")}
        for library in sorted(path.stem for path in libdir.glob("*.so")):
            # sepgsql, for one, loads only as a preloaded library
            with contextlib.suppress(psycopg.Error):
                conn.execute(sql.SQL("load {}").format(sql.Literal(library)))
        for name in sorted(n for n in names if re.fullmatch("[a-z_][a-z0-9_]*", n)):
            try:
                with conn.transaction():
                    conn.execute("select set_config(%s, '1', true)", (f"{name}.claim_front",))
            except psycopg.errors.InvalidName:
                reserved.append(name)
    return reserved


def test_a_schema_named_for_a_reserved_setting_prefix_is_refused(
    template: Path, tmp_path: Path, stack: Cluster
) -> None:
    """The queue keeps per-transaction settings named `<schema>.<name>`: under a prefix an
    extension reserves (plpgsql, auto_explain, ...) every claim would fail."""
    reserved = reserved_setting_prefixes(stack)
    assert {"plpgsql", "plpgsql_check", "auto_explain", "supautils"} <= set(reserved)
    accepted = []
    for name in reserved:
        try:
            render(template, tmp_path / name, queue_schema=name)
        except ValueError as refused:
            assert "queue_schema" in str(refused) and "reserve" in str(refused), refused
        else:
            accepted.append(name)
    assert accepted == [], "copier accepted schemas whose settings PostgreSQL refuses"


def test_every_question_has_a_validator_or_fixed_choices() -> None:
    for name, spec in questions().items():
        bounded = "validator" in spec or "choices" in spec or spec.get("type") == "bool"
        assert bounded, f"{name} accepts anything"
        assert spec.get("help"), f"{name} has no help text"


def test_the_package_question_says_what_the_package_is_for_an_edge_project_too() -> None:
    """An edge project's Python package is its dashboard's and CLI's, not a worker's: the
    question asked before the worker style says so (a new user was asked for "the worker's"
    package and chose an Edge Function worker)."""
    asked = " ".join(questions()["package_name"]["help"].split())
    assert "src/<package_name>" in asked and "dashboard/src/<package_name>" in asked, asked
    assert "Edge Function" in asked, asked


# What each worker style is asked besides worker_style: the wake-up questions only where the
# database POSTs to the worker (python LISTENs or polls), the transport only of Python workers,
# the function's name only of the edge worker.
EVERY_STYLE = {
    "project_name",
    "project_slug",
    "package_name",
    "queue_schema",
    "max_attempts",
    "lease_seconds",
    "sweep_schedule",
    "retention_days",
}
WAKE_UP = {"worker_url", "worker_url_setting", "service_key_setting"}
ASKED = {
    "python": EVERY_STYLE | {"claim_transport"},
    "python-http": EVERY_STYLE | {"claim_transport"} | WAKE_UP,
    "edge": EVERY_STYLE | {"edge_function_name"} | WAKE_UP,
}


@pytest.mark.parametrize("style", choices("worker_style"))
def test_each_worker_style_is_asked_only_the_questions_it_uses(
    template: Path, tmp_path: Path, style: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = record_prompts(monkeypatch)
    with COPIER_LOCK:
        copier.run_copy(
            str(template),
            str(tmp_path / "app"),
            data={"worker_style": style},
            unsafe=True,
            vcs_ref="HEAD",
            quiet=True,
        )
    assert sorted(asked) == sorted(ASKED[style]), "each question it uses, once"
    # what was not asked is not recorded either: an update does not carry it along
    recorded = yaml.safe_load((tmp_path / "app/.copier-answers.yml").read_text())
    assert {k for k in recorded if not k.startswith("_")} == ASKED[style] | {"worker_style"}


def test_the_databases_messages_name_the_templates_pages_by_url(
    template: Path, tmp_path: Path
) -> None:
    """docs/ is the template repo's, not the project's: a notice or error of the queue's
    migrations and functions that points there gives the full URL."""
    for baseline in ("0.1.0", "1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0"):
        project = render(template, tmp_path / baseline, queue_baseline=baseline)
        for migration in (project / "supabase/migrations").glob("*.sql"):
            code = re.sub(r"--[^\n]*", "", migration.read_text())
            strings = re.findall(r"'((?:[^']|'')*)'", code)
            relative = [s for s in strings if re.search(r"(?<![/\w])docs/[\w/-]+\.md", s)]
            assert relative == [], f"{migration.name} names the template's docs by a path"
