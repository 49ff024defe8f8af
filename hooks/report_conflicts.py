"""Copier migration, run in the project at the end of every `copier update`: names the files
the update left for you to resolve, where your changes and the release's touch the same lines.

Copier runs `_tasks` before it merges the release into your files, so only a migration (an
entry of `_migrations` without a version runs after every update, once the merge is done) can
see what the merge left: with `--conflict inline` (Copier's default) files with conflict
markers, which Copier marks unmerged in git's index; with `--conflict rej`, `*.rej` files next
to the files whose hunks did not apply. Prints nothing when there is nothing to resolve.

Usage: report_conflicts.py
"""

from __future__ import annotations

import subprocess
import sys

GUIDE = "README.md (Taking template releases)"


def git_lines(*args: str) -> list[str]:
    probe = subprocess.run(["git", *args], capture_output=True, text=True)
    return probe.stdout.splitlines() if probe.returncode == 0 else []


def unmerged() -> list[str]:
    """Files the merge left with conflict markers (unmerged entries in git's index)."""
    return sorted(set(git_lines("diff", "--name-only", "--diff-filter=U")))


def rejects() -> list[str]:
    """`*.rej` files, ignored or not, that git does not track."""
    return sorted(p for p in git_lines("ls-files", "--others") if p.endswith(".rej"))


def report(markers: list[str], rej: list[str]) -> str:
    lines = []
    if markers:
        lines += [
            f"pgqueue-template: the update left conflict markers in {len(markers)} "
            f"file{'s' if len(markers) > 1 else ''}:",
            *(f"  {name}" for name in markers),
            "In each, keep what you want between `<<<<<<< before updating` and "
            "`>>>>>>> after updating`, delete the markers, then `git add` the file.",
        ]
    if rej:
        lines += [
            f"pgqueue-template: the update could not apply {len(rej)} "
            f"change{'s' if len(rej) > 1 else ''}, kept in:",
            *(f"  {name}" for name in rej),
            "Apply each by hand to the file it is named after, then delete the .rej file.",
        ]
    if lines:
        lines.append(f"Then review and commit; {GUIDE} says more.")
    return "\n".join(lines)


def main() -> str:
    message = report(unmerged(), rejects())
    if message:
        print(message, file=sys.stderr)
    return message


if __name__ == "__main__":
    main()
