"""Jobs of an app's signed-in users (release 1.1.0, capped in 1.2.0; docs/client-jobs.md),
through the Data API (the PostgREST stand-in) with real JWTs: two signed-in users, an anonymous
visitor, a token of another role that names a user, and the service role, on the session's
hosted-shaped database."""

from __future__ import annotations

import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from testkit.plans import plans_logged
from testkit.postgrest import PostgRESTStandIn, make_jwt

PUBLIC = "pgqueue_public"
KIND = "export_data"


class Caller:
    """One side of the Data API: a signed-in user (with their id), the anonymous visitor (no
    token: PostgREST's anon role) or the service role."""

    def __init__(self, api: PostgRESTStandIn, role: str | None, user: uuid.UUID | None = None):
        self.user = user
        claims = {"sub": str(user)} if user else {}
        token = make_jwt(role, **claims) if role else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = f"{api.url}/rest/v1"

    def rpc(self, fn: str, schema: str = PUBLIC, **args) -> httpx.Response:
        headers = {**self.headers, "Content-Profile": schema}
        return httpx.post(f"{self.url}/rpc/{fn}", json=args, headers=headers, timeout=30)

    def read(self, relation: str, schema: str = PUBLIC, **params: str) -> httpx.Response:
        headers = {**self.headers, "Accept-Profile": schema}
        return httpx.get(f"{self.url}/{relation}", params=params, headers=headers, timeout=30)

    def submit(self, payload: dict | None = None, kind: str = KIND, **args) -> httpx.Response:
        return self.rpc("client_enqueue", kind=kind, payload=payload or {}, **args)

    def my_jobs(self) -> list[dict]:
        response = self.read("my_jobs", select="*", order="id.desc")
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def alice(app_api: PostgRESTStandIn) -> Caller:
    return Caller(app_api, "authenticated", uuid.uuid4())


@pytest.fixture
def bob(app_api: PostgRESTStandIn) -> Caller:
    return Caller(app_api, "authenticated", uuid.uuid4())


def allow(db: psycopg.Connection, kind: str = KIND, per_minute: int = 60, **caps: int) -> None:
    names = "".join(f", {name} => %({name})s" for name in caps)
    db.execute(
        f"select pgqueue.allow_client_kind(%(kind)s, %(per_minute)s{names})",
        {"kind": kind, "per_minute": per_minute, **caps},
    )


def submit_in_sql(db: psycopg.Connection, user: uuid.UUID, jobs: int, kind: str = KIND) -> None:
    """`jobs` jobs submitted by `user` in one transaction, as the Data API would run
    client_enqueue() for them (role authenticated, their claims): thousands in a second."""
    claims = json.dumps({"role": "authenticated", "sub": str(user)})
    with db.transaction():
        db.execute("select set_config('role', 'authenticated', true)")
        db.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
        db.execute(
            "select pgqueue_public.client_enqueue(%s) from generate_series(1, %s)", (kind, jobs)
        )


def claim_one(db: psycopg.Connection, kind: str = KIND) -> tuple[int, uuid.UUID]:
    (job_id, token) = db.execute(
        "select id, lock_token from pgqueue.claim('client-test', kinds => array[%s])", (kind,)
    ).fetchone()
    return job_id, token


def test_nothing_is_open_to_users_by_default(clients: psycopg.Connection, alice: Caller) -> None:
    refused = alice.submit({"report": 1})
    assert refused.status_code == 403
    assert (
        refused.json()["message"] == "jobs of kind 'export_data' cannot be submitted from the app"
    )
    assert "allow_client_kind" in refused.json()["hint"]
    assert clients.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def test_anonymous_visitors_and_the_service_role_cannot_submit_as_a_user(
    clients: psycopg.Connection, app_api: PostgRESTStandIn
) -> None:
    allow(clients)
    anonymous = Caller(app_api, None).submit()
    assert anonymous.status_code == 401
    assert anonymous.json()["message"] == "sign in to submit a job: only signed-in users may"
    # the service role enqueues with pgqueue.enqueue(): a job here has an owner or nothing
    service = Caller(app_api, "service_role").submit()
    assert service.status_code == 403
    assert service.json()["code"] == "42501"
    assert Caller(app_api, None).read("my_jobs").status_code == 401
    assert clients.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def test_a_user_submits_follows_and_sees_the_result_of_their_own_job(
    clients: psycopg.Connection, alice: Caller, bob: Caller
) -> None:
    allow(clients)
    submitted = alice.submit({"format": "csv"})
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()
    [job] = alice.my_jobs()
    assert {k: job[k] for k in ("id", "kind", "status", "progress", "result", "error")} == {
        "id": job_id, "kind": KIND, "status": "queued", "progress": None, "result": None,
        "error": None,
    }  # fmt: skip
    assert "payload" not in job, "my_jobs shows what the handler reports, not what was sent"
    assert bob.my_jobs() == []

    # the worker sees the owner, and reports as for any job
    assert claim_one(clients)[0] == job_id
    (owners,) = clients.execute(
        "select array_agg(owner) from pgqueue.job_owners(array[%s::bigint, 424242])", (job_id,)
    ).fetchone()
    assert owners == [alice.user]
    (token,) = clients.execute(
        "select lock_token from pgqueue.claims where %s = any (ids)", (job_id,)
    ).fetchone()
    clients.execute("select pgqueue.progress(%s, %s, %s)", (job_id, token, Jsonb({"rows": 500})))
    [running] = alice.my_jobs()
    assert (running["status"], running["progress"]) == ("running", {"rows": 500})
    clients.execute(
        "select pgqueue.complete(%s, %s, %s)",
        (job_id, token, Jsonb({"url": "exports/a.csv"})),
    )
    [done] = alice.my_jobs()
    assert (done["status"], done["result"]) == ("done", {"url": "exports/a.csv"})
    assert done["finished_at"] is not None
    assert bob.my_jobs() == []


def test_users_see_only_the_errors_the_worker_failed_as_user_facing(
    clients: psycopg.Connection, alice: Caller
) -> None:
    allow(clients)
    shown, prefixed, hidden = (alice.submit({"n": n}).json() for n in range(3))
    tokens = dict(
        clients.execute(
            "select id, lock_token from pgqueue.claim('client-test', 10, kinds => array[%s])",
            (KIND,),
        ).fetchall()
    )
    assert clients.execute(
        "select pgqueue.fail_user_facing(%s, %s, %s)",
        (shown, tokens[shown], "the file is larger than 10 MB"),
    ).fetchone() == ("failed",)
    # a worker of 1.1.0 sends a UserFacingError as text: any error's text can begin so
    for job_id, error in (
        (prefixed, "UserFacingError: connection to 10.0.0.5 refused (password=hunter2)"),
        (hidden, "KeyError: 'DATABASE_PASSWORD'"),
    ):
        clients.execute(
            "select pgqueue.fail(%s, %s, %s, retryable => false)", (job_id, tokens[job_id], error)
        )
    errors = {job["id"]: (job["status"], job["error"]) for job in alice.my_jobs()}
    assert errors == {
        shown: ("failed", "the file is larger than 10 MB"),
        prefixed: ("failed", None),
        hidden: ("failed", None),
    }
    (last_error,) = clients.execute("select last_error from pgqueue.job(%s)", (shown,)).fetchone()
    assert last_error == "UserFacingError: the file is larger than 10 MB"
    # a stale token records nothing, and a job retried by hand shows no old error
    assert clients.execute(
        "select pgqueue.fail_user_facing(%s, %s, 'again')", (shown, tokens[shown])
    ).fetchone() == (None,)
    clients.execute("select pgqueue.retry(%s)", (shown,))
    assert {job["id"]: job["error"] for job in alice.my_jobs()}[shown] is None


def test_a_user_cancels_only_their_own_queued_job(
    clients: psycopg.Connection, app_api: PostgRESTStandIn, alice: Caller, bob: Caller
) -> None:
    allow(clients)
    mine, running = alice.submit().json(), alice.submit().json()
    assert bob.rpc("client_cancel", job_id=mine).json() is False
    assert alice.rpc("client_cancel", job_id=424242).json() is False
    assert claim_one(clients)[0] == mine
    # now running: a user cancels only what has not started
    assert alice.rpc("client_cancel", job_id=mine).json() is False
    assert alice.rpc("client_cancel", job_id=running).json() is True
    states = {job["id"]: job["status"] for job in alice.my_jobs()}
    assert states == {mine: "running", running: "cancelled"}
    assert Caller(app_api, None).rpc("client_cancel", job_id=running).status_code == 401


def test_the_per_user_rate_holds_under_concurrent_submits(
    clients: psycopg.Connection, alice: Caller, bob: Caller
) -> None:
    allow(clients, per_minute=5)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: alice.submit({"i": i}), range(20)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 5 + [429] * 15
    refused = next(a for a in answers if a.status_code == 429).json()
    assert refused["message"] == "too many jobs of kind 'export_data': at most 5 a minute per user"
    assert refused["hint"] == "Try again in 12 seconds."
    # a bucket per user: bob is not slowed by alice
    assert [bob.submit().status_code for _ in range(5)] == [200] * 5
    assert bob.submit().status_code == 429
    assert len(alice.my_jobs()) == 5


def test_idempotency_keys_are_per_user(
    clients: psycopg.Connection, alice: Caller, bob: Caller
) -> None:
    allow(clients)
    first = alice.submit({"a": 1}, idempotency_key="monthly-report").json()
    assert alice.submit({"a": 2}, idempotency_key="monthly-report").json() == first
    other = bob.submit({"b": 1}, idempotency_key="monthly-report").json()
    assert other != first
    assert [j["id"] for j in alice.my_jobs()] == [first]
    assert [j["id"] for j in bob.my_jobs()] == [other]


def test_users_reach_nothing_of_the_queue_but_its_public_schema(
    clients: psycopg.Connection, alice: Caller, app_api: PostgRESTStandIn
) -> None:
    allow(clients)
    alice.submit({"secret": "alice's"})
    for relation in ("jobs", "client_jobs", "client_kinds", "all_jobs"):
        assert alice.read(relation, schema="pgqueue").status_code == 403
        assert Caller(app_api, None).read(relation, schema="pgqueue").status_code == 401
    for fn, args in (
        ("job_owners", {"job_ids": [1]}),
        ("allow_client_kind", {"kind": "anything", "per_minute": 1000}),
        ("enqueue", {"kind": KIND}),
        ("caller_id", {}),
        ("fail_user_facing", {"job_id": 1, "lock_token": str(uuid.uuid4()), "message": "x"}),
    ):
        assert alice.rpc(fn, schema="pgqueue", **args).status_code == 403, fn


def test_closing_a_kind_refuses_new_jobs_and_keeps_the_old_ones_visible(
    clients: psycopg.Connection, alice: Caller
) -> None:
    allow(clients)
    job_id = alice.submit().json()
    assert clients.execute("select pgqueue.disallow_client_kind(%s)", (KIND,)).fetchone() == (True,)
    assert clients.execute("select pgqueue.disallow_client_kind(%s)", (KIND,)).fetchone() == (
        False,
    )
    assert alice.submit().status_code == 403
    assert [j["id"] for j in alice.my_jobs()] == [job_id]


@pytest.mark.parametrize(
    ("kind", "per_minute", "message"),
    [
        ("", 10, "kind must be a name of 1 to 200 characters, got ''"),
        (KIND, 0, "per_minute must be 1 to 10000 jobs a minute per user, got 0"),
        (KIND, None, "per_minute must be 1 to 10000 jobs a minute per user, got null"),
        (KIND, 10, "max_per_user must be 1 to 10000 queued or running jobs, got 0"),
        (KIND, 10, "max_total must be 1 to 1000000 queued or running jobs, got -1"),
        ("x" * 10_000, 10, "kind must be a name of 1 to 200 characters, got 'x{100}'\\.\\.\\. "),
    ],
)
def test_opening_a_kind_refuses_bad_input(
    clients: psycopg.Connection, kind: str, per_minute: int | None, message: str
) -> None:
    caps = {"max_per_user": 0} if "max_per_user" in message else {}
    caps |= {"max_total": -1} if "max_total" in message else {}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message) as refused:
        allow(clients, kind, per_minute, **caps)
    assert len(refused.value.diag.message_primary) < 200, "a refusal quotes at most 100 characters"


def test_a_payload_over_64_kib_is_refused_and_costs_nothing(
    clients: psycopg.Connection, alice: Caller
) -> None:
    allow(clients, per_minute=1)
    refused = alice.submit({"blob": "x" * 70_000})
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"].endswith("a job submitted from the app takes at most 64 KiB")
    assert alice.submit({"ok": True}).status_code == 200


def test_the_sweep_drops_owners_with_their_jobs(clients: psycopg.Connection, alice: Caller) -> None:
    allow(clients)
    kept, pruned = alice.submit().json(), alice.submit().json()
    clients.execute("select pgqueue.cancel(%s)", (pruned,))
    clients.execute(
        "update pgqueue.job_history set finished_at = now() - interval '30 days' where id = %s",
        (pruned,),
    )
    clients.execute("update pgqueue.client_jobs set created_at = now() - interval '30 days'")
    clients.execute("update pgqueue.client_rates set updated_at = now() - interval '2 hours'")
    clients.execute("select pgqueue.sweep()")
    owned = clients.execute("select job_id from pgqueue.client_jobs").fetchall()
    assert owned == [(kept,)]
    assert clients.execute("select count(*) from pgqueue.client_rates").fetchone() == (0,)


def test_a_token_of_another_role_is_refused_whatever_user_it_names(
    clients: psycopg.Connection, app_api: PostgRESTStandIn, alice: Caller
) -> None:
    allow(clients)
    mine = alice.submit().json()
    for role, status in (("anon", 401), ("service_role", 403)):
        impostor = Caller(app_api, role, alice.user)  # a token whose sub is alice's id
        refused = impostor.submit()
        assert refused.status_code == status, (role, refused.text)
        assert refused.json()["code"] == "42501"
        assert impostor.rpc("client_cancel", job_id=mine).status_code == status
    # anon may not read my_jobs at all; the service role reads no user's jobs through it
    assert Caller(app_api, "anon", alice.user).read("my_jobs").status_code == 401
    # a session that sets the claims itself but is not `authenticated` is nobody either
    claims = json.dumps({"role": "authenticated", "sub": str(alice.user)})
    with clients.transaction():
        clients.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
        assert clients.execute("select pgqueue.caller_id()").fetchone() == (None,)
        assert clients.execute("select count(*) from pgqueue_public.my_jobs").fetchone() == (0,)
    assert [j["id"] for j in alice.my_jobs()] == [mine]


def test_each_users_cap_holds_under_concurrent_submits(
    clients: psycopg.Connection, alice: Caller, bob: Caller
) -> None:
    allow(clients, per_minute=1000, max_per_user=5)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: alice.submit({"i": i}), range(20)))
    assert sorted(a.status_code for a in answers) == [200] * 5 + [429] * 15
    refused = next(a for a in answers if a.status_code == 429).json()
    assert refused["message"] == (
        "too many jobs of kind 'export_data': at most 5 queued or running per user"
    )
    assert refused["hint"].startswith("Try again in 10 seconds")
    # running jobs count too; a finished one frees its place at once
    job_id, token = claim_one(clients)
    assert alice.submit().status_code == 429
    clients.execute("select pgqueue.complete(%s, %s)", (job_id, token))
    assert alice.submit().status_code == 200
    assert alice.submit().status_code == 429
    # a cap per user: bob is not held back by alice's jobs
    assert [bob.submit().status_code for _ in range(6)] == [200] * 5 + [429]


def test_the_kinds_total_cap_holds_under_concurrent_submits_of_many_users(
    clients: psycopg.Connection, app_api: PostgRESTStandIn
) -> None:
    allow(clients, per_minute=1000, max_per_user=4, max_total=10)
    users = [Caller(app_api, "authenticated", uuid.uuid4()) for _ in range(5)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: users[i % 5].submit({"i": i}), range(25)))
    assert sorted(a.status_code for a in answers) == [200] * 10 + [429] * 15
    messages = {a.json()["message"] for a in answers if a.status_code == 429}
    assert "too many jobs of kind 'export_data': at most 10 queued or running from all users" in (
        messages
    )
    assert clients.execute("select count(*) from pgqueue.jobs").fetchone() == (10,)
    # finished jobs leave the count (the sweeper recounts each minute, a full kind at most
    # once a second): two done, two more accepted
    for _ in range(2):
        clients.execute("select pgqueue.complete(%s, %s)", claim_one(clients))
    clients.execute("select pgqueue.sweep()")
    fresh = Caller(app_api, "authenticated", uuid.uuid4())
    assert [fresh.submit().status_code for _ in range(3)] == [200, 200, 429]
    assert clients.execute(
        "select live from pgqueue.client_kinds where kind = %s", (KIND,)
    ).fetchone() == (10,)


def test_a_worker_claims_the_apps_job_before_thousands_of_users_jobs(
    clients: psycopg.Connection,
) -> None:
    allow(clients, per_minute=10_000, max_per_user=1000)
    for _ in range(3):
        submit_in_sql(clients, uuid.uuid4(), 1000)
    app_job = clients.execute(
        "select pgqueue.enqueue('send_email', '{}', run_after => now() + interval '1 ms')"
    ).fetchone()[0]
    clients.execute("select pg_sleep(0.01)")
    # a worker that takes every kind, in batches
    claimed = clients.execute("select id, kind from pgqueue.claim('client-test', 5)").fetchall()
    assert claimed[0] == (app_job, "send_email")
    assert [kind for _, kind in claimed[1:]] == [KIND] * 4


def test_my_jobs_reads_only_the_page_asked_for_through_the_owners_index(
    clients: psycopg.Connection, alice: Caller
) -> None:
    allow(clients, per_minute=10_000, max_per_user=10_000)
    submit_in_sql(clients, alice.user, 300)
    clients.execute(
        "select pgqueue.cancel(id) from pgqueue.jobs where id %% 2 = 0 and kind = %s", (KIND,)
    )
    # another user's jobs, newer than hers (a scan by id from the newest would pass them all),
    # and the statistics autovacuum would gather
    submit_in_sql(clients, uuid.uuid4(), 300)
    clients.execute("analyze pgqueue.client_jobs")
    claims = json.dumps({"role": "authenticated", "sub": str(alice.user)})
    with plans_logged(clients) as plans, clients.transaction():
        clients.execute("set local auto_explain.log_analyze = on")
        clients.execute("select set_config('role', 'authenticated', true)")
        clients.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
        page = clients.execute(
            "select id, status from pgqueue_public.my_jobs order by id desc limit 20"
        ).fetchall()
    assert len(page) == 20 and page == sorted(page, reverse=True)
    [plan] = [p for p in plans if "my_jobs" in p]
    # the owner's index, in id order, read no further than the page: 20 rows, 20 lookups
    scan = re.search(r"Index (Only )?Scan using client_jobs_owner_idx .*", plan)
    assert scan is not None and re.search(r"\(actual .* rows=20 loops=1\)", scan[0]), plan
    assert "Sort" not in plan, plan
    assert len(alice.my_jobs()) == 300


def test_refusals_quote_at_most_100_characters_of_what_was_sent(
    clients: psycopg.Connection, alice: Caller
) -> None:
    kind = "k" * 10_000
    refused = alice.submit(kind=kind)
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        f"jobs of kind '{'k' * 100}'... (10000 characters) cannot be submitted from the app"
    )
    long_key = alice.submit(idempotency_key="i" * 10_000)
    assert long_key.status_code in (400, 403)
    assert "i" * 101 not in long_key.text
    allow(clients, per_minute=1)
    alice.submit(idempotency_key="i" * 150)
    too_long = alice.submit(idempotency_key="i" * 10_000)
    assert too_long.status_code == 400
    assert too_long.json()["message"] == "idempotency_key must be at most 200 characters, got 10000"
