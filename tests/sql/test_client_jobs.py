"""Jobs of an app's signed-in users (release 1.1.0, docs/client-jobs.md), through the Data API
(the PostgREST stand-in) with real JWTs: two signed-in users, an anonymous visitor and the
service role, on the session's hosted-shaped database."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

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


def allow(db: psycopg.Connection, kind: str = KIND, per_minute: int = 60) -> None:
    db.execute("select pgqueue.allow_client_kind(%s, %s)", (kind, per_minute))


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


def test_users_see_only_the_errors_their_handler_chose_to_show(
    clients: psycopg.Connection, alice: Caller
) -> None:
    allow(clients)
    shown, hidden = alice.submit({"n": 1}).json(), alice.submit({"n": 2}).json()
    tokens = dict(
        clients.execute(
            "select id, lock_token from pgqueue.claim('client-test', 10, kinds => array[%s])",
            (KIND,),
        ).fetchall()
    )
    for job_id, error in (
        (shown, "UserFacingError: the file is larger than 10 MB"),
        (hidden, "KeyError: 'DATABASE_PASSWORD'"),
    ):
        clients.execute(
            "select pgqueue.fail(%s, %s, %s, retryable => false)", (job_id, tokens[job_id], error)
        )
    errors = {job["id"]: (job["status"], job["error"]) for job in alice.my_jobs()}
    assert errors == {
        shown: ("failed", "the file is larger than 10 MB"),
        hidden: ("failed", None),
    }


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
        ("caller_jobs", {}),
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
    ],
)
def test_opening_a_kind_refuses_bad_input(
    clients: psycopg.Connection, kind: str, per_minute: int | None, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        allow(clients, kind, per_minute)


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
