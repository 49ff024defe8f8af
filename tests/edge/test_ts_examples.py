"""The docs' TypeScript examples type-check against the Edge Function they describe: each ```ts
block of docs/*.md and of the function's README becomes the index.ts of a function next to it
(as the README has the queue client used from another function), checked by `deno check`
with the function's deno.json. A marker `<!-- example: first <ts> -->` gives the imports and
the names a block takes as given (tests/docs/test_doc_examples.py lists the markers)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from testkit.project import REPO
from tests.support.doc_examples import Example, examples

from .deno_worker import FUNCTION, Deno

DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if examples(p, p.name, "ts"))


def type_check(deno: Deno, function_dir: Path, root: Path, found: list[Example]) -> list[str]:
    """Each example `deno check` complains about, named by its page and line, with the
    complaints (one check for all of them)."""
    functions = root / "functions"
    shutil.copytree(function_dir, functions / FUNCTION)
    modules = {}
    for n, example in enumerate(found):
        if not example.skipped:
            module = functions / f"example_{n}" / "index.ts"
            module.parent.mkdir()
            module.write_text(example.first + example.code)
            modules[f"example_{n}/index.ts"] = example
    proc = subprocess.run(
        [deno.binary, "check", "--config", f"{FUNCTION}/deno.json", *modules],
        cwd=functions,
        env=deno.env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    if proc.returncode == 0:
        return []
    named = [
        f"{example}: {proc.stderr}" for path, example in modules.items() if path in proc.stderr
    ]
    return named or [f"deno check failed on no example:\n{proc.stderr}"]


def test_the_typescript_examples_type_check(deno: Deno, function_dir: Path, tmp_path: Path) -> None:
    found = [e for page in DOC_PAGES for e in examples(page, f"docs/{page.name}", "ts")]
    found += examples(function_dir / "README.md", f"functions/{FUNCTION}/README.md", "ts")
    assert len(found) >= 5, found
    assert type_check(deno, function_dir, tmp_path, found) == []


def test_a_wrong_typescript_example_fails_naming_its_page(
    deno: Deno, function_dir: Path, tmp_path: Path
) -> None:
    first = 'import { supabaseQueue } from "../job-worker/queue.ts";\n'
    wrong = Example("docs/x.md", 3, "await supabaseQueue().enqueueJob('x');\n", f"first {first}")
    (failure,) = type_check(deno, function_dir, tmp_path, [wrong])
    assert failure.startswith("docs/x.md:3: ") and "enqueueJob" in failure
