"""The docs' Python examples type-check against the project they describe: each ```python
block of docs/*.md and of the variant's README becomes a module in a copy of the project's
handlers/ (the user's code, checked as the project checks it) under the project's own mypy.

A block is the body of an async function, since the examples `await` at the top; a marker
`<!-- example: first <python> -->` gives the module's imports and the names the block takes
as given, and `<!-- example: module -->` says the block is a whole handler module, checked as
it stands (tests/docs/test_doc_examples.py lists the markers). The handlers README's examples
are such modules. A renamed method, argument or model
field then fails here, naming the page and line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from testkit.project import REPO, variant
from tests.support.doc_examples import Example, examples
from tests.support.workers import PACKAGE, Installed

DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if examples(p, p.name, "python"))


def example_module(example: Example) -> str:
    if example.marker == "module":
        return f'"""{example}: an example of the docs."""\n\n{example.code}'
    return (
        f'"""{example}: an example of the docs."""\n\n'
        "from __future__ import annotations\n\n"
        f"{example.first}\n\n"
        "async def example() -> None:\n"
        f"{textwrap.indent(example.code, '    ')}"
    )


def type_check(installed: Installed, root: Path, found: list[Example]) -> str:
    """mypy's complaints about the examples, each line naming its example's page and line."""
    project = root / "project"
    shutil.copytree(installed.path, project, ignore=shutil.ignore_patterns(".mypy_cache"))
    handlers = project / "src" / PACKAGE / "handlers"
    checked = {}
    for n, example in enumerate(found):
        if not example.skipped:
            (handlers / f"doc_example_{n}.py").write_text(example_module(example))
            checked[f"doc_example_{n}.py"] = example
    assert checked, "no example to check"
    proc = subprocess.run([installed.bin("mypy")], cwd=project, capture_output=True, text=True)
    return "\n".join(
        re.sub(r"\S*(doc_example_\d+\.py):(\d+)", lambda m: f"{checked[m[1]]} (+{m[2]})", line)
        for line in proc.stdout.splitlines()
        if "doc_example_" in line or (proc.returncode != 0 and "error" in line)
    )


def all_examples(installed: Installed) -> list[Example]:
    found = [e for page in DOC_PAGES for e in examples(page, f"docs/{page.name}", "python")]
    found += examples(installed.path / "README.md", "README.md", "python")
    handlers = installed.path / "src" / PACKAGE / "handlers" / "README.md"
    return found + examples(handlers, "handlers/README.md", "python")


def uses_supabase_py(example: Example) -> bool:
    """An example of an app's code with supabase-py (docs/client-jobs.md), which only the
    supabase transport's projects depend on."""
    return "from supabase import" in example.first + example.code


# The postgres transport's projects: the docs import its transport, and the README's example
# enqueues on a direct connection with psycopg, which they depend on.
@pytest.mark.parametrize(
    "installed",
    [variant("python", "postgres"), variant("python-http", "postgres")],
    indirect=True,
    ids=str,
)
def test_the_python_examples_type_check(installed: Installed, tmp_path: Path) -> None:
    found = [e for e in all_examples(installed) if not uses_supabase_py(e)]
    assert type_check(installed, tmp_path, found) == ""


@pytest.mark.parametrize("installed", [variant("python", "supabase")], indirect=True, ids=str)
def test_the_supabase_py_examples_type_check(installed: Installed, tmp_path: Path) -> None:
    found = [e for e in all_examples(installed) if uses_supabase_py(e) and not e.skipped]
    assert len(found) >= 2, found  # docs/client-jobs.md's and the README's
    assert type_check(installed, tmp_path, found) == ""


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_a_wrong_python_example_fails_naming_its_page(installed: Installed, tmp_path: Path) -> None:
    first = "from my_app.queue import QueueClient\nqueue: QueueClient\n"
    wrong = Example(
        "docs/x.md", 12, "await queue.enqueue_job('send_email', {})\n", f"first {first}"
    )
    assert "docs/x.md:12" in type_check(installed, tmp_path, [wrong])


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_a_handler_module_example_must_define_what_it_uses(
    installed: Installed, tmp_path: Path
) -> None:
    """The handlers README's old example called download(), upload() and resize(), defined
    nowhere: a whole-module example is checked as it stands, so that fails."""
    code = (
        "from pydantic import BaseModel\n\nfrom ..registry import JobInfo, handler\n\n\n"
        "class Resize(BaseModel):\n    path: str\n\n\n"
        '@handler("resize")\nasync def resize(payload: Resize, job: JobInfo) -> None:\n'
        "    await download(payload.path)\n"
    )
    complaints = type_check(installed, tmp_path, [Example("handlers/README.md", 9, code, "module")])
    assert 'handlers/README.md:9 (+14): error: Name "download" is not defined' in complaints
