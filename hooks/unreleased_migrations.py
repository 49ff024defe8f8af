"""Copier migration, run in the project before `copier update` writes anything: finds queue
migrations the project got from a template commit that is not a release, and repairs them or
refuses the update.

A release's migrations never change once released, and `copier update` never rewrites a
migration a project has (`_skip_if_exists`: the database has applied it). A project copied
or updated at a commit between two releases, though, holds that commit's text under the name
a release later used for other text (`..._pgqueue_1_1_0.sql` at 202d53d lacks `checkout()`,
`take_rows()` and the sequence `claim_fronts` that release 1.1.0's has); an update keeps the
old text, and the queue silently misses what changed after that commit.

So, when the answers file has ever recorded a `_commit` that is not one of RELEASES, this
renders the release being updated to and compares each queue migration the project has with
the same file there, rendered with the answers it was rendered with (those of the commit that
added it to the project: an answer changed since reaches the database through a configuration
migration, not through that file). Equal: nothing to do, nothing printed.
Different: where the difference is only in what can be replaced in place (functions, views,
comments and grants redefined, sequences and indexes added), it writes a repair migration
that applies the release's definitions with `create or replace` and `if not exists`, so it
can run again, right after the file it repairs; a line `-- pgqueue-template repair:` names the
file and the release text it brings the database to, so later updates know. Anything else
(a table changed, a migration no release has, a later release's step already taken) cannot
be repaired safely without knowing the database: the update is refused, nothing changed, with
what to do. docs/upgrading.md ("Updating a project made from a commit that is not a release").

Usage: unreleased_migrations.py <template clone> <commit updated to> <answers file>
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
import warnings
from datetime import datetime, timedelta
from pathlib import Path

# The template's releases: version and commit (tagged v<version> where the repo has tags).
# tests/upgrade/test_unreleased_commit.py holds it equal to testkit.project.RELEASES.
RELEASES = {
    "0.1.0": "70dac053ab119c34acd88192799949587f9889a3",
    "1.0.0": "da6d237aaf83aceef25e630a77de5da765088ab2",
    "1.1.0": "cad73d8a523a55df1a68499063534f5c45091eaf",
    "1.2.0": "d63641ba6ef4889656c002659d1a71dbb8c49204",
    "1.3.0": "c5d7f43aff82a7ef71cc79114d794b136192348f",
    "1.4.0": "fb9e3a888b348803a41663564f2fd65d7b65c4f7",
    "1.5.0": "d38daa3e9c3f23d8cc93c5427c4b4433b28f7b33",
}
MIGRATIONS = Path("supabase/migrations")
MARKER = "-- pgqueue-template repair: "
DOCS = (
    "https://github.com/org/pgqueue-template/blob/main/docs/upgrading.md"
    "#updating-a-project-made-from-a-commit-that-is-not-a-release"
)
QUEUE_FILE = re.compile(r"^\d{14}_pgqueue_(?!(?:config|repair)\.sql$).*\.sql$")
# `create [or replace] function|view|sequence|index <name>`, and `comment on <object> is`
DEFINITION = re.compile(
    r"^create\s+(?:or\s+replace\s+)?(function|view|sequence|(?:unique\s+)?index)\s+"
    r"(?:concurrently\s+)?(?:if\s+not\s+exists\s+)?([\w.\"]+)",
    re.IGNORECASE,
)
COMMENT = re.compile(r"^comment\s+on\s+(.+?)\s+is\s", re.IGNORECASE | re.DOTALL)
# the opening of a dollar-quoted string: $$ or $tag$
DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_]\w*)?\$")
# what `create or replace` (or `comment on`) defines again whole
REDEFINABLE = ("function ", "view ", "comment ")
# `grant|revoke <privileges> on [<kind>] <objects> to|from <roles>`
ACL = re.compile(
    r"^(?:grant|revoke)\s.*?\son\s+(?:(function|table|sequence|schema|type)\s+)?(.*?)\s+"
    r"(?:to|from)\s+(.*?)(?:\s+cascade|\s+with\s+grant\s+option)?;$",
    re.IGNORECASE | re.DOTALL,
)
# `alter function <name>(<argument types>) set|reset ...`: a setting of the function's own
FUNCTION_SETTING = re.compile(
    r"^alter\s+function\s+([\w.\"]+)\s*\(.*?\)\s+(?:set|reset)\s", re.IGNORECASE | re.DOTALL
)


def git(*args: str, cwd: Path | None = None) -> str | None:
    probe = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def recorded_commits(answers_file: Path) -> list[str]:
    """Every `_commit` the answers file has recorded: now, and in the project's git history
    (a project updated from a development commit to a release remembers the first)."""
    found = re.findall(r"^_commit: (\S+)$", answers_file.read_text(encoding="utf-8"), re.M)
    history = git("log", "--format=", "-p", "--", str(answers_file)) or ""
    found += re.findall(r"^[+-]_commit: (\S+)$", history, re.M)
    return list(dict.fromkeys(found))


def unreleased(template: Path, commits: list[str]) -> list[str]:
    """The commits among these that are no release, by the template's own history (a
    `git describe` name such as v1.0.0-4-g202d53d resolves too)."""
    releases = set(RELEASES.values())
    resolved = {c: git("rev-parse", "--verify", f"{c}^{{commit}}", cwd=template) for c in commits}
    return [c for c in commits if resolved[c] not in releases]


def render_release(template: Path, commit: str, answers: dict, dest: Path) -> Path:
    """The template at `commit` as a project created with these answers and queue baseline
    renders it (what `copier update` would have rendered, had no file been kept)."""
    import copier  # Copier runs this script with its own interpreter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copier.run_copy(
            str(template), str(dest), data=answers, defaults=True, unsafe=True,
            vcs_ref=commit, quiet=True,
        )  # fmt: skip
    return dest / MIGRATIONS


def statements(sql: str) -> list[str]:
    """The SQL's statements, each without the comments and blank lines before it; quotes,
    dollar-quoted bodies and comments may hold semicolons."""
    found, start, i = [], 0, 0
    while i < len(sql):
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end
        elif sql.startswith("/*", i):
            i = sql.index("*/", i) + 2
        elif sql[i] in "'\"":
            i = sql.index(sql[i], i + 1) + 1  # a doubled quote reads as two strings: same end
        elif sql[i] == "$" and (tag := DOLLAR_QUOTE.match(sql, i)):
            i = sql.index(tag[0], tag.end()) + len(tag[0])
        else:
            if sql[i] == ";":
                found.append(sql[start : i + 1])
                start = i + 1
            i += 1
    return [re.sub(r"\A(?:\s*--[^\n]*\n|\s+)*", "", s) for s in found]


def object_of(statement: str) -> str | None:
    """What a statement defines, as `function <name>(<arguments>)`, `view <name>`, ...,
    `comment <object>`; None for any other statement."""
    if m := COMMENT.match(statement):
        return "comment " + " ".join(m[1].split())
    if not (m := DEFINITION.match(statement)):
        return None
    kind = m[1].lower().split()[-1]
    if kind != "function":
        return f"{kind} {m[2]}"
    rest, depth = statement[m.end() :], 0
    for n, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ")" and depth == 0:
            return f"function {m[2]}" + " ".join(rest[: n + 1].split())
    return None


def privileges(statement: str) -> set[tuple[str, str]]:
    """The (object, role) pairs a grant or revoke sets, written without spaces."""
    if not (m := ACL.match(statement)):
        return set()
    depth, objects, part = 0, [], ""
    for char in m[2] + ",":
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            objects.append((m[1] or "table").lower() + " " + "".join(part.split()))
            part = ""
        else:
            part += char
    return {(o, r.strip().lower()) for o in objects for r in m[3].split(",")}


def function_name(statement: str) -> str | None:
    """The function a statement defines or sets a setting of."""
    if m := FUNCTION_SETTING.match(statement):
        return m[1]
    defined = object_of(statement) or ""
    return defined.split("(")[0].split()[1] if defined.startswith("function ") else None


def repair(old_sql: str, new_sql: str) -> tuple[list[str], list[str]]:
    """The statements that bring a database from `old_sql`'s schema to `new_sql`'s, each one
    safe to run again, and what stands in the way (no repair when there is any).

    Functions, views and comments are defined again whole (`create or replace`), and with a
    function its settings (`alter function ... set`), which a new definition resets. A
    sequence or index the old text lacks is made `if not exists`. A grant or revoke of the old
    text only is undone by running all of the new text's again, in order, where those set
    every privilege it set. Anything else is a problem: it would need the database to know."""
    old, new = statements(old_sql), statements(new_sql)
    old_set, new_set = set(old), set(new)
    added = [s for s in new if s not in old_set]
    dropped = [s for s in old if s not in new_set]
    defined = {object_of(s) for s in added} - {None}
    existing = {object_of(s) for s in old} - {None}
    redefined = {function_name(s) for s in added if DEFINITION.match(s)} - {None}
    granted = set().union(*(privileges(s) for s in new))
    regrant = False
    problems = []
    for s in dropped:
        if privileges(s):
            regrant = True
            if not privileges(s) <= granted:
                problems.append(s)
        elif FUNCTION_SETTING.match(s):
            if function_name(s) not in redefined:
                problems.append(s)
        elif (o := object_of(s)) not in defined or not o.startswith(REDEFINABLE):
            problems.append(s)
    fixes = []
    for s in new:
        defines = object_of(s) or ""
        if privileges(s):
            if s not in old_set or regrant:
                fixes.append(s)
        elif FUNCTION_SETTING.match(s):
            if s not in old_set or function_name(s) in redefined:
                fixes.append(s)
        elif s in old_set:
            continue
        elif defines.startswith(REDEFINABLE):
            fixes.append(s)
        elif defines.startswith(("sequence ", "index ")) and defines not in existing:
            fixes.append(re.sub(r"\s(sequence|index)\s", r" \1 if not exists ", s, count=1))
        else:
            problems.append(s)
    return fixes, [s.splitlines()[0] for s in problems]


def repair_sql(name: str, commit: str, release: str, fixes: list[str], digest: str) -> str:
    return (
        f"-- Repair of {name}, which this project got from template commit {commit}, not\n"
        f"-- a release: it defines again what {release}'s text of that file defines otherwise,\n"
        f"-- and adds what that commit lacked, so that the queue is the release's. Made by\n"
        "-- `copier update` (pgqueue-template); it can run again. Like every migration, never\n"
        "-- edit it once applied.\n"
        f"{MARKER}{json.dumps({name: digest})}\n\n" + "\n\n".join(fixes) + "\n"
    )


def repairs_made(migrations: Path) -> dict[str, str]:
    """{repaired file: digest of the release text it was brought to} from the repair lines."""
    made: dict[str, str] = {}
    for path in sorted(migrations.glob("*.sql")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(MARKER):
                made |= json.loads(line.removeprefix(MARKER))
    return made


def next_second(stamp: str) -> str:
    moment = datetime.strptime(stamp, "%Y%m%d%H%M%S") + timedelta(seconds=1)
    return moment.strftime("%Y%m%d%H%M%S")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check(
    have: dict[str, str], released: dict[str, str], commit: str, release: str
) -> tuple[dict[str, str], list[str]]:
    """The repair migrations to write ({file name: text}) and the problems that forbid them,
    for the project's queue migrations `have` and the release's render `released`."""
    made = repairs_made(MIGRATIONS)
    writes: dict[str, str] = {}
    problems: list[str] = []
    for name, text in sorted(have.items()):
        if name not in released:  # (marked: the project's own migration deals with it)
            if name not in made:
                problems.append(f"{name}: {release} has no migration of this name")
            continue
        target = digest(released[name])
        if text == released[name] or made.get(name) == target:
            continue
        if name in made:
            problems.append(f"{name}: repaired before to a text {release} does not have")
            continue
        if later := sorted(n for n in have if n[:8] > name[:8]):
            problems.append(
                f"{name}: differs from {release}'s, and {later[0]} came after it (whether "
                "your database applied that on top of this text cannot be told from here)"
            )
            continue
        fixes, blocking = repair(text, released[name])
        problems += [f"{name}: differs from {release}'s in `{line}`" for line in blocking]
        stamp = next_second(max(n[:14] for n in have if n[:8] == name[:8]))
        repair_name = f"{stamp}_pgqueue_repair.sql"
        if (MIGRATIONS / repair_name).exists() or repair_name in writes:
            problems.append(f"{name}: {MIGRATIONS / repair_name} exists already")
        elif not blocking:
            writes[repair_name] = repair_sql(name, commit, release, fixes, target)
    return writes, problems


def refusal(
    commit: str, release: str, ref: str, problems: list[str], released: dict, answers_file: Path
) -> str:
    def digest_of(name: str) -> str:
        return f"<sha256sum of /tmp/release/{MIGRATIONS}/{name}>" if name in released else "none"

    recorded = answers_file.read_text(encoding="utf-8")
    src = re.search(r"^_src_path: (.+)$", recorded, re.M)
    baseline = re.search(r"^_queue_baseline: (.+)$", recorded, re.M)
    return "\n".join([
        f"pgqueue-template: this project's queue migrations come from template commit "
        f"{commit}, which is not a release, and differ from {release}'s in what cannot be "
        "repaired in place:",
        *(f"  {p}" for p in problems),
        "`copier update` keeps a migration your database has applied, so it would leave the "
        "queue without what changed after that commit. Nothing was changed. To go on:",
        f"  1. render {release} with your answers and compare:",
        f"       copier copy --trust --defaults --data-file {answers_file} "
        f"-d queue_baseline={baseline[1] if baseline else '0.1.0'} --vcs-ref {ref} "
        f"{src[1] if src else '<template>'} /tmp/release",
        f"       diff -r {MIGRATIONS} /tmp/release/{MIGRATIONS}",
        "  2. write a migration of your own that makes your database's queue what the "
        "release's text makes it (or, if the queue holds nothing you need, reset the "
        "database from the release's files);",
        "  3. mark it, with the line for each file this says differs:",
        *(f"       {MARKER}{json.dumps({name: digest_of(name)})}"
          for name in sorted({p.split(":")[0] for p in problems})),
        "     commit, and run `copier update` again.",
        *(f"  4. that update deletes {MIGRATIONS / name}, which {release} does not have: put "
          f"it back (git checkout HEAD -- {MIGRATIONS / name}) before you commit the update."
          for name in sorted({p.split(":")[0] for p in problems}) if name not in released),
        f"See {DOCS}",
    ])  # fmt: skip


def answers_for(migration: Path, answers_file: Path) -> dict:
    """The answers `migration` was rendered with: the answers file of the commit that added it
    to the project (a later answer, such as a lease changed on update, reaches the database
    through a configuration migration, never through that file), else the answers file now."""
    import yaml  # Copier's own dependency

    added = (git("log", "--diff-filter=A", "--format=%H", "--", str(migration)) or "").split()
    text = git("show", f"{added[-1]}:./{answers_file}") if added else None
    recorded = yaml.safe_load(text or answers_file.read_text(encoding="utf-8"))
    answers = {k: v for k, v in recorded.items() if not k.startswith("_")}
    return answers | {"queue_baseline": recorded.get("_queue_baseline", "0.1.0")}


def released_texts(
    template: Path, target: str, have: dict[str, str], answers_file: Path, scratch: Path
) -> dict[str, str]:
    """{file: text} of each of the project's queue migrations that `target` renders, rendered
    with the answers that file was rendered with (one render for each set of answers)."""
    renders: dict[str, dict[str, str]] = {}
    released = {}
    for name in have:
        answers = answers_for(MIGRATIONS / name, answers_file)
        key = json.dumps(answers, sort_keys=True)
        if key not in renders:
            rendered = render_release(template, target, answers, scratch / str(len(renders)))
            renders[key] = {p.name: p.read_text(encoding="utf-8") for p in rendered.glob("*.sql")}
        if name in renders[key]:
            released[name] = renders[key][name]
    return released


def main(template: Path, target: str, answers_file: Path) -> int:
    commits = unreleased(template, recorded_commits(answers_file))
    if not commits:
        return 0
    have = {
        p.name: p.read_text(encoding="utf-8")
        for p in MIGRATIONS.glob("*.sql")
        if QUEUE_FILE.match(p.name)
    }
    with tempfile.TemporaryDirectory() as scratch:
        try:
            released = released_texts(template, target, have, answers_file, Path(scratch))
        except Exception as error:  # the update itself then says what is wrong, in full
            print(f"pgqueue-template: could not check {MIGRATIONS}: {error}", file=sys.stderr)
            return 0
    tag = git("describe", "--tags", "--exact-match", target, cwd=template) or ""
    ref = tag if re.fullmatch(r"v\d+(\.\d+)*", tag) else target[:7]
    release = f"release {ref[1:]}" if ref == tag else f"commit {ref}"
    commit = commits[-1].rsplit("-g", 1)[-1]
    writes, problems = check(have, released, commit, release)
    if problems:
        print(refusal(commit, release, ref, problems, released, answers_file), file=sys.stderr)
        return 1
    for file, text in writes.items():
        (MIGRATIONS / file).write_text(text, encoding="utf-8")
        print(
            f"pgqueue-template: {MIGRATIONS / file} repairs the queue migration this project got "
            f"from template commit {commit}, not a release, to what {release} has.",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
