"""The current release's queue: a new project starts from its baseline migrations (from 1.3.0 a
few topic files in reading order) in which every table, view and function is defined once, and
a project created at any earlier release that `copier update`s to it with live jobs ends with
the same schema (docs/maintainers/releases.md)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from testkit.hosted import start_hosted_cluster
from testkit.project import (
    VARIANTS,
    Variant,
    push_migrations,
    release_refs,
    release_version,
    render,
    render_repo,
    supabase,
    update,
)
from tests.support.releases import RELEASE_ANSWERS, fill_queue
from tests.support.schema import differences, queue_schema

MIGRATIONS = "supabase/migrations"
# a new project's migrations: 1.5.0's baseline, by topic, in the order they apply
BASELINE_TOPICS = ["tables", "enqueue", "claim", "running_jobs", "failure", "flow_control",
                   "jobs_and_results", "observability", "client_jobs", "configuration"]  # fmt: skip
BASELINE = [
    f"20261211{i:06d}_pgqueue_1_5_0_{topic}.sql" for i, topic in enumerate(BASELINE_TOPICS, 1)
]
# `create [or replace] <kind> [if not exists] <schema>.<name>`, and `create trigger <name>`
DEFINITION = re.compile(
    r"^create (?:or replace )?(function|view|table|type|sequence|(?:unique )?index|trigger)"
    r"\s+(?:if not exists\s+)?([\w.]+)",
    re.MULTILINE | re.IGNORECASE,
)
# Issue 35's budget for a new project's queue SQL: 4,500 lines at 1.0.0 (8,712 before its
# baseline). A later release's baseline may grow by what it adds, each allowance named here:
# the budget bounds growth, it does not forbid features.
MAX_QUEUE_LINES = {
    "1.0.0": 4_500,
    # 1.1.0: checkout() and sweep()'s step prune() (+40); claim fronts published between
    # sessions, the sequence claim_fronts and runnable_jobs()'s step claim_front() (+60); a
    # claim of rows without the parts for batches, take_rows() (+80); complete_claimed() one
    # statement per case (+20). The part for signed-in users, a section of its own, has its
    # own budget.
    "1.1.0": 4_500 + 40 + 60 + 80 + 20,
    # 1.2.0: a security release; the pinned search_path's comment (+3); wake-ups signed
    # instead of carrying the secret: pgcrypto, wake_signature(), and wake() and
    # wake_up_target() checking and making signatures (+100); the setting
    # config.workers_poll, and what health() says a missing worker URL or wake-up secret costs
    # (+16), and when wake-ups cannot be signed (+11)
    "1.2.0": 4_500 + 40 + 60 + 80 + 20 + 3 + 100 + 16 + 11,
}
# Issue 35: no queue function longer than this, `create` to `$$;` (split into named steps)
MAX_FUNCTION_LINES = 150
# `create [or replace] function <name>(`, up to the `$$;` that ends its body
FUNCTION = re.compile(r"^create (?:or replace )?function ([\w.]+)\(.*?^\$\$;", re.M | re.S)
# 1.1.0's section for signed-in users' jobs: 350. 1.2.0 (issue 47's caps) adds the caps and
# their recount (end_client_jobs(), check_client_caps(), take_client_token() split out of
# client_enqueue(), the live columns; +110), the role check and the quoting of refusals
# (caller_id(), quoted(); +30), user-facing errors told by type (fail_user_facing(); +30) and a
# my_jobs that reads only the page asked for (its lookups in one plan, the planner's
# statistics; +30).
MAX_CLIENT_LINES = 350 + 110 + 30 + 30 + 30
BASELINES = {
    "1.0.0": "20261206000000_pgqueue_1_0_0.sql",
    "1.1.0": "20261207000000_pgqueue_1_1_0.sql",
    "1.2.0": "20261208000000_pgqueue_1_2_0.sql",
}
CLIENT_SECTION = "-- == Jobs of signed-in users"


def baseline_sql(project: Path) -> str:
    """A new project's queue migrations, one text, in the order they apply."""
    return "\n".join((project / MIGRATIONS / name).read_text() for name in BASELINE)


def definitions(sql: str) -> Counter[str]:
    return Counter(f"{kind.lower()} {name}" for kind, name in DEFINITION.findall(sql))


def long_functions(sql: str) -> dict[str, int]:
    """The functions of `sql` over MAX_FUNCTION_LINES lines, with their length."""
    lengths = {m[1]: m[0].count("\n") + 1 for m in FUNCTION.finditer(sql)}
    return {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_a_new_project_defines_each_queue_object_once(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    project = render(template, tmp_path / "app", **variant.answers)
    migrations = sorted(p.name for p in (project / MIGRATIONS).iterdir())
    assert migrations == BASELINE
    counts = definitions(baseline_sql(project))
    assert {name: n for name, n in counts.items() if n > 1} == {}
    # what the count reads: every kind of object, the hot path among them
    assert {"table pgqueue.jobs", "function pgqueue.complete_and_claim", "view pgqueue.stats",
            "type pgqueue.claimed_job", "trigger jobs_wake_workers",
            "sequence pgqueue.claim_fronts"} <= set(counts)  # fmt: skip
    assert {"function pgqueue._prune", "function pgqueue_public.client_enqueue",
            "view pgqueue_public.my_jobs"} <= set(counts)  # fmt: skip
    # 68 at 1.1.0; 1.2.0's signed wake-ups: wake_signature(); its caps on users' jobs:
    # caller_id(), quoted(), end_client_jobs(), take_client_token(), check_client_caps(),
    # fail_user_facing(); less caller_jobs(); 1.3.0's failure.sql, each statement once:
    # _requeue(), _to_history(), _unqueue() (was take_back_rescued()), _end_attempt(),
    # _unbatch(), _rescue_expired() (+5; prune() is _prune()); flow_control.sql's
    # _check_queue_name() (+1); the named steps of metrics(), health() and configure():
    # _live_counts(), _wake_up_health(), _check_settings() (+3); the inlined _due_bucket() (+1);
    # the claim's steps (25 functions in claim.sql before its split, 26 in claim.sql and
    # running_jobs.sql after: +1); 1.4.0's schedules in a time zone: _cron_bits(), _cron_runs(),
    # _sync_schedule_runner(), _enqueue_slot(), _run_schedules() (+5); 1.4.0's job list:
    # list_jobs(), count_jobs(), retry_jobs(), cancel_jobs(), _check_job_filter(),
    # _job_conditions() (+6); 1.4.0's attempt errors and snoozes: _record_errors(), snooze(),
    # _prune_attempt_logs(), _job_is_kept() (+4); retry()'s statement as _revive(), which
    # retry_jobs() calls too (+1); 1.5.0's workflows: dependency_results(), workflow(),
    # _enqueue_dependents(), _lock_dependencies(), _finished_jobs(), _job_states(),
    # _dependency_failure(), _job_elements(), _check_elements(), _join_workflows(),
    # _dependencies_finished(), _release_waiting(), _cancel_waiting(), _dependencies_failed(),
    # _dependents_revived(), _recount_waiting(), _release_stuck(), _related_jobs(),
    # _workflow_members(), _waiting_sources() (+20)
    functions = [n for n in counts if n.startswith("function ")]
    assert len(functions) == 68 + 1 + 6 - 1 + 5 + 1 + 3 + 1 + 1 + 5 + 6 + 4 + 1 + 20
    assert long_functions(baseline_sql(project)) == {}
    client = (
        (project / MIGRATIONS / BASELINE[BASELINE_TOPICS.index("client_jobs")])
        .read_text()
        .split(CLIENT_SECTION)[1]
    )
    assert len(client.splitlines()) <= MAX_CLIENT_LINES


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_each_release_baseline_keeps_its_line_budget(
    template: Path, tmp_path: Path, variant: Variant
) -> None:
    for release, budget in MAX_QUEUE_LINES.items():
        project = render(template, tmp_path / release, queue_baseline=release, **variant.answers)
        queue = (project / MIGRATIONS / BASELINES[release]).read_text().split(CLIENT_SECTION)[0]
        assert len(queue.splitlines()) <= budget, release


def test_the_count_finds_an_object_defined_twice() -> None:
    sql = "create table s.jobs (id int);\ncreate or replace function s.f() ...;\n" * 2
    assert definitions(sql) == {"table s.jobs": 2, "function s.f": 2}


def test_the_length_check_finds_a_function_too_long() -> None:
    body = "  select 1;\n" * MAX_FUNCTION_LINES
    sql = "create function s.short()\nas $$\n  select 1;\n$$;\n\n"
    sql += f"create or replace function s.long(a int)\nas $$\n{body}$$;\n"
    assert long_functions(sql) == {"s.long": MAX_FUNCTION_LINES + 3}


# fresh_schema()'s dumps, by answer set: a new project's schema is the same whichever release
# it is compared with, so each test process pushes it once per answer set
_FRESH: dict[str, dict[str, str]] = {}


def fresh_schema(history: Path, tmp_path: Path, answers: dict) -> dict[str, str]:
    """The queue's schema as a new project at HEAD pushes it, for `answers` (a copy)."""
    key = json.dumps(answers, sort_keys=True)
    if key not in _FRESH:
        project = render(history, tmp_path / "fresh", vcs_ref="HEAD", **answers)
        _FRESH[key] = pushed_schema(project, answers)
    return dict(_FRESH[key])


def pushed_schema(project: Path, answers: dict) -> dict[str, str]:
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        return queue_schema(cluster, answers.get("queue_schema", "pgqueue"))
    finally:
        cluster.destroy()


def upgraded_schema(history: Path, tmp_path: Path, answers: dict, ref: str) -> dict[str, str]:
    """A project created at release `ref`, its queue holding jobs in every state, updated to
    HEAD."""
    schema = answers.get("queue_schema", "pgqueue")
    project = render_repo(
        history,
        tmp_path / "upgraded",
        f"generated at {release_version(ref)}",
        vcs_ref=ref,
        **answers,
    )
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            fill_queue(db, schema)
            # The sweeper stays off for the steps: a sweep reads config, then waits on the jobs
            # a step has locked, while 1.2.0's step waits to alter config, and one of the two is
            # rolled back as a deadlock (docs/upgrading.md says to push again). What this test
            # compares is the schema; test_upgrade_under_load.py runs steps beside workers.
            db.execute("update cron.job set active = false")
        update(project, "HEAD")
        supabase(project, "migration", "up", "--db-url", cluster.url())
        return queue_schema(cluster, schema)
    finally:
        cluster.destroy()


@pytest.mark.parametrize("ref", release_refs(), ids=release_version)
@pytest.mark.parametrize("answers", RELEASE_ANSWERS.values(), ids=RELEASE_ANSWERS)
def test_a_project_updated_from_a_release_has_the_schema_of_a_new_one(
    history: Path, tmp_path: Path, answers: dict, ref: str
) -> None:
    fresh = fresh_schema(history, tmp_path, answers)
    upgraded = upgraded_schema(history, tmp_path, answers, ref)
    assert len(fresh) > 100, "the dump holds the queue's objects"
    assert differences(fresh, upgraded) == []


def test_the_schema_comparison_names_a_function_changed_on_one_side(
    history: Path, tmp_path: Path
) -> None:
    fresh = fresh_schema(history, tmp_path, {})
    project = render(history, tmp_path / "changed", vcs_ref="HEAD")
    baseline = project / MIGRATIONS / BASELINE[BASELINE_TOPICS.index("failure")]
    text = baseline.read_text()
    # backoff()'s base delay, 5 s, becomes 6 s on this side only
    changed = text.replace("5 * power(2,", "6 * power(2,", 1)
    assert changed != text, "backoff() no longer reads as the test expects"
    baseline.write_text(changed)
    assert differences(fresh, pushed_schema(project, {})) == ["FUNCTION backoff(integer): differs"]
