"""The docs' code examples: fenced blocks of one language in a Markdown page, each with the
marker an HTML comment before it may carry (tests/docs/test_doc_examples.py says what markers mean).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# What a block may be skipped for: only what this machine cannot provide (the Supabase stack,
# a hosted project, the network) or what would run this repo's own suite inside itself.
LACKING = ("supabase start", "hosted project", "the network", "the template's own")
# The languages of shell blocks: each is run by a test, or marked (see shell_blocks()).
SHELLS = ("sh", "bash", "shell", "console")


def block(language: str) -> re.Pattern[str]:
    return re.compile(
        r"^(?:[ \t]*<!-- example: (?P<marker>(?:(?!-->).)*?) -->\n\n)?(?P<indent>[ \t]*)```"
        + re.escape(language)
        + r"\n(?P<body>.*?)^(?P=indent)```",
        re.M | re.S,
    )


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    code: str
    marker: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first(self) -> str:
        """The code a `first <code>` marker gives, to run (or have) before the block."""
        return self.marker.removeprefix("first ") + "\n" if self.marker.startswith("first ") else ""

    @property
    def skipped(self) -> bool:
        """Marked `not run (why)`; `why` must name what this machine lacks."""
        if not self.marker.startswith("not run"):
            return False
        assert any(reason in self.marker for reason in LACKING), (
            f"{self}: a block may be left out only for what this machine lacks "
            f"({', '.join(LACKING)}); its marker says {self.marker!r}"
        )
        return True


def examples(page: Path, name: str, language: str = "sql") -> list[Example]:
    text = page.read_text()
    found = []
    for m in block(language).finditer(text):
        assert "```" not in (m["marker"] or ""), f"{name}: a marker runs into a code block"
        body = "\n".join(line.removeprefix(m["indent"]) for line in m["body"].splitlines())
        line = text.count("\n", 0, m.start("indent")) + 1
        found.append(Example(name, line, body + "\n", m["marker"] or ""))
    return found


def shell_blocks(page: Path, name: str) -> list[Example]:
    return sorted(
        (e for language in SHELLS for e in examples(page, name, language)), key=lambda e: e.line
    )
