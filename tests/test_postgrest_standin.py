"""The PostgREST stand-in, driven by the real supabase-py client (and raw HTTP for statuses)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from postgrest.exceptions import APIError
from supabase import Client, ClientOptions, create_client

from testkit.cluster import Cluster
from testkit.postgrest import JWT_SECRET, PostgRESTStandIn, make_jwt
from tests.support.jobs import job

# Helpers the tests create in `public` (exposed, default privileges to the API roles).
HELPERS_SQL = """
create table public.standin_log (id serial primary key, note text not null);
create function public.standin_whoami(note text default null)
returns jsonb language sql volatile as $$
  select jsonb_build_object(
    'current_user', current_user,
    'claims', current_setting('request.jwt.claims', true)::jsonb,
    'claim_role', current_setting('request.jwt.claim.role', true),
    'method', current_setting('request.method', true),
    'path', current_setting('request.path', true),
    'header_profile', current_setting('request.headers', true)::jsonb ->> 'content-profile',
    'search_path', current_setting('search_path'),
    'read_only', current_setting('transaction_read_only'),
    'note', note)
$$;
create function public.standin_add(a integer, b integer default 10)
returns integer language sql stable as $$ select a + b $$;
create function public.standin_nothing() returns void language sql as $$ select $$;
create function public.standin_pair(x integer, out doubled integer, out label text)
language sql immutable as $$ select x * 2, 'n' || x $$;
create function public.standin_log_then_fail(note text) returns void language plpgsql as $$
begin
  insert into public.standin_log (note) values (note);
  raise exception 'refused: %', note using hint = 'try again', detail = 'some detail';
end
$$;
create function public.standin_unique() returns void language plpgsql as $$
begin
  raise unique_violation using message = 'duplicate thing';
end
$$;
"""
HELPERS_DROP = """
drop function if exists public.standin_whoami(text), public.standin_add(integer, integer),
  public.standin_nothing(), public.standin_pair(integer), public.standin_log_then_fail(text),
  public.standin_unique();
drop table if exists public.standin_log;
"""

QUEUE_CALLS = {
    "enqueue": {"kind": "email"},
    "enqueue_many": {"jobs": [{"kind": "email"}]},
    "claim": {"worker": "w1"},
    "complete": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "complete_many": {"job_ids": [1], "lock_tokens": [str(uuid.uuid4())]},
    "fail": {"job_id": 1, "lock_token": str(uuid.uuid4()), "error": "boom"},
    "heartbeat": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "release": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "retry": {"job_id": 1},
    "cancel": {"job_id": 1},
    "sweep": {},
}


@pytest.fixture(scope="module")
def rest(stack: Cluster, project: Path) -> Iterator[PostgRESTStandIn]:
    """The stand-in, logged in as `authenticator` like the real PostgREST."""
    with stack.connect(autocommit=True) as conn:
        conn.execute(HELPERS_DROP)
        conn.execute(HELPERS_SQL)
    with PostgRESTStandIn(stack.dsn(user="authenticator"), pool_size=10) as server:
        yield server
    with stack.connect(autocommit=True) as conn:
        conn.execute(HELPERS_DROP)


def client(rest: PostgRESTStandIn, role: str = "service_role", **claims) -> Client:
    return create_client(
        rest.url, make_jwt(role, **claims), options=ClientOptions(schema="pgqueue")
    )


def post(rest: PostgRESTStandIn, fn: str, body: dict, token: str | None = None, **headers):
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.setdefault("Content-Profile", "pgqueue")
    return httpx.post(f"{rest.url}/rest/v1/rpc/{fn}", json=body, headers=headers, timeout=10)


def test_service_role_enqueues_claims_and_completes(rest, db):
    sb = client(rest)
    q = sb.schema("pgqueue")
    job_id = q.rpc("enqueue", {"kind": "email", "payload": {"to": "a@example.com"}}).execute().data
    assert isinstance(job_id, int)
    assert job(db, job_id)["status"] == "queued"

    claimed = q.rpc("claim", {"worker": "w1", "max_jobs": 5, "kinds": ["email"]}).execute().data
    assert isinstance(claimed, list) and len(claimed) == 1
    row = claimed[0]
    assert row["id"] == job_id
    assert row["status"] == "running"
    assert row["attempts"] == 1
    assert row["payload"] == {"to": "a@example.com"}
    assert str(job(db, job_id)["lock_token"]) == row["lock_token"]
    assert job(db, job_id)["locked_by"] == "w1"

    done = q.rpc("complete", {"job_id": job_id, "lock_token": row["lock_token"]}).execute()
    assert done.data is True
    assert job(db, job_id)["status"] == "done"
    # the token is spent: a second complete changes nothing and says so
    again = q.rpc("complete", {"job_id": job_id, "lock_token": row["lock_token"]}).execute()
    assert again.data is False
    # nothing left to claim: an empty array, not null
    assert q.rpc("claim", {"worker": "w1"}).execute().data == []


def test_enqueue_many_and_complete_many_with_arrays(rest, db):
    q = client(rest).schema("pgqueue")
    jobs = [{"kind": "a"}, {"kind": "b", "priority": 5}, {"kind": "a", "idempotency_key": "k"}]
    ids = q.rpc("enqueue_many", {"jobs": jobs}).execute().data
    assert isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) for i in ids)
    # kinds text[] from a JSON array filters the claim
    claimed = q.rpc("claim", {"worker": "w", "max_jobs": 10, "kinds": ["a"]}).execute().data
    assert sorted(r["id"] for r in claimed) == sorted([ids[0], ids[2]])
    assert job(db, ids[1])["status"] == "queued"

    stale = str(uuid.uuid4())
    result = q.rpc(
        "complete_many",
        {
            "job_ids": [claimed[0]["id"], claimed[1]["id"]],
            "lock_tokens": [claimed[0]["lock_token"], stale],
        },
    ).execute()
    assert result.data == [claimed[0]["id"]]
    assert job(db, claimed[0]["id"])["status"] == "done"
    assert job(db, claimed[1]["id"])["status"] == "running"


def test_fail_with_interval_and_sweep_table_result(rest, db):
    q = client(rest).schema("pgqueue")
    job_id = q.rpc("enqueue", {"kind": "x", "max_attempts": 1}).execute().data
    (row,) = q.rpc("claim", {"worker": "w"}).execute().data
    status = q.rpc(
        "fail",
        {"job_id": job_id, "lock_token": row["lock_token"], "error": "bad", "retry_in": "5 min"},
    ).execute()
    assert status.data == "failed"
    # returns table(...) -> an array of objects
    swept = q.rpc("sweep", {}).execute().data
    assert swept == [{"rescued": 0, "dead_lettered": 0, "pruned": 0, "woke": False}]
    dead = q.table("dead_letters").select("id,last_error").execute().data
    assert dead == [{"id": job_id, "last_error": "bad"}]


@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_api_roles_are_refused_every_queue_function(rest, db, role):
    q = client(rest, role).schema("pgqueue")
    for fn, args in QUEUE_CALLS.items():
        with pytest.raises(APIError) as err:
            q.rpc(fn, args).execute()
        assert err.value.code == "42501", (fn, err.value.json())
        assert "permission denied" in (err.value.message or ""), fn
        response = post(rest, fn, args, make_jwt(role))
        assert response.status_code == (401 if role == "anon" else 403), fn
    with pytest.raises(APIError) as err:
        q.table("stats").select("*").execute()
    assert err.value.code == "42501"
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def test_no_token_is_anon_and_apikey_header_is_accepted(rest, db):
    response = post(rest, "enqueue", {"kind": "x"})
    assert response.status_code == 401
    assert response.json()["code"] == "42501"
    assert response.headers["www-authenticate"] == "Bearer"
    # without Authorization, the gateway's apikey header carries the token
    response = post(rest, "enqueue", {"kind": "x"}, apikey=make_jwt("service_role"))
    assert response.status_code == 200, response.text
    assert job(db, response.json())["status"] == "queued"


def test_bad_tokens_are_401(rest, db):
    forged = make_jwt("service_role", secret="another-secret-that-is-at-least-32-chars")
    sb = create_client(rest.url, forged, options=ClientOptions(schema="pgqueue"))
    with pytest.raises(APIError) as err:
        sb.schema("pgqueue").rpc("enqueue", {"kind": "x"}).execute()
    assert err.value.code == "PGRST301"
    response = post(rest, "enqueue", {"kind": "x"}, forged)
    assert response.status_code == 401
    assert set(response.json()) == {"code", "details", "hint", "message"}
    assert "invalid_token" in response.headers["www-authenticate"]

    expired = make_jwt("service_role", exp=int(time.time()) - 3600)
    response = post(rest, "enqueue", {"kind": "x"}, expired)
    assert (response.status_code, response.json()["message"]) == (401, "JWT expired")
    response = post(rest, "enqueue", {"kind": "x"}, "not-a-jwt")
    assert response.status_code == 401
    assert response.json()["code"] == "PGRST301"
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)


def test_roles_the_login_role_cannot_become(rest):
    # authenticator is not a member of postgres: the database refuses the switch
    response = post(rest, "enqueue", {"kind": "x"}, make_jwt("postgres"))
    assert response.status_code == 403
    assert response.json()["code"] == "42501"
    response = post(rest, "enqueue", {"kind": "x"}, make_jwt("nobody_at_all"))
    assert response.status_code == 401
    assert response.json()["code"] == "22023"


def test_unknown_function_and_arguments_are_404(rest):
    q = client(rest).schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.rpc("no_such_function", {"a": 1}).execute()
    assert err.value.code == "PGRST202"
    assert err.value.message == (
        "Could not find the function pgqueue.no_such_function(a) in the schema cache"
    )
    response = post(rest, "claimm", {"worker": "w"}, make_jwt("service_role"))
    assert response.status_code == 404
    assert response.json()["hint"] == "Perhaps you meant to call the function pgqueue.claim"
    # the right name with a wrong argument name, or without a required one
    with pytest.raises(APIError) as err:
        q.rpc("complete", {"job_id": 1, "token": str(uuid.uuid4())}).execute()
    assert err.value.code == "PGRST202"
    assert "pgqueue.complete(job_id, token)" in (err.value.message or "")
    with pytest.raises(APIError) as err:
        q.rpc("claim", {"max_jobs": 1}).execute()
    assert err.value.code == "PGRST202"
    # a function of another exposed schema is not found in this one
    with pytest.raises(APIError) as err:
        client(rest).schema("public").rpc("claim", {"worker": "w"}).execute()
    assert err.value.code == "PGRST202"


def test_unexposed_schema_is_406(rest):
    with pytest.raises(APIError) as err:
        client(rest).schema("vault").rpc("create_secret", {"new_secret": "s"}).execute()
    assert err.value.code == "PGRST106"
    response = httpx.get(f"{rest.url}/rest/v1/jobs", headers={"Accept-Profile": "auth"}, timeout=10)
    assert response.status_code == 406
    assert response.json()["message"] == "The schema must be one of the following: public, pgqueue"


def test_raise_exception_comes_back_as_api_error(rest, db):
    q = client(rest).schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.rpc("claim", {"worker": "w", "max_jobs": 0}).execute()
    assert err.value.code == "22023"
    assert err.value.message == "max_jobs must be between 1 and 10000, got 0"
    response = post(rest, "enqueue_many", {"jobs": {"kind": "x"}}, make_jwt("service_role"))
    assert response.status_code == 400
    assert response.json()["code"] == "22023"
    # a value Postgres cannot cast to the parameter's type is the database's error too
    with pytest.raises(APIError) as err:
        q.rpc("complete", {"job_id": 1, "lock_token": "not-a-uuid"}).execute()
    assert err.value.code == "22P02"


def test_errors_roll_back_and_keep_details(rest, db):
    sb = client(rest)
    with pytest.raises(APIError) as err:
        sb.schema("public").rpc("standin_log_then_fail", {"note": "n1"}).execute()
    assert err.value.json() == {
        "code": "P0001",
        "details": "some detail",
        "hint": "try again",
        "message": "refused: n1",
    }
    assert db.execute("select count(*) from public.standin_log").fetchone() == (0,)
    response = post(
        rest, "standin_unique", {}, make_jwt("service_role"), **{"Content-Profile": "public"}
    )
    assert (response.status_code, response.json()["code"]) == (409, "23505")
    # asking for one object and getting several rolls the call back (PGRST116)
    q = sb.schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.rpc("enqueue_many", {"jobs": [{"kind": "a"}, {"kind": "b"}]}).single().execute()
    assert err.value.code == "PGRST116"
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (0,)
    one = q.rpc("enqueue_many", {"jobs": [{"kind": "a"}]}).single().execute()
    assert isinstance(one.data, int)


def test_request_settings_role_and_shapes(rest):
    sb = client(rest, "authenticated", sub="11111111-1111-1111-1111-111111111111")
    pub = sb.schema("public")
    me = pub.rpc("standin_whoami", {"note": "hi"}).execute().data
    assert me["current_user"] == "authenticated"
    assert me["claims"]["sub"] == "11111111-1111-1111-1111-111111111111"
    assert me["claims"]["role"] == "authenticated"
    assert me["claim_role"] == "authenticated"
    assert me["method"] == "POST"
    assert me["path"] == "/rpc/standin_whoami"
    assert me["header_profile"] == "public"
    assert me["search_path"] == '"public", "extensions"'
    assert me["read_only"] == "off"
    assert me["note"] == "hi"
    # defaults apply to arguments left out; a STABLE function runs read-only
    assert pub.rpc("standin_add", {"a": 1}).execute().data == 11
    assert pub.rpc("standin_add", {"a": 1, "b": 2}).execute().data == 3
    # a single composite (OUT parameters) is an object, not an array
    assert pub.rpc("standin_pair", {"x": 4}).execute().data == {"doubled": 8, "label": "n4"}
    # void -> 204 without a body
    response = post(rest, "standin_nothing", {}, make_jwt("anon"), **{"Content-Profile": "public"})
    assert (response.status_code, response.content) == (204, b"")
    # GET calls run read-only: fine for a STABLE function, refused for a volatile one
    response = httpx.get(f"{rest.url}/rest/v1/rpc/standin_add?a=5&b=6", timeout=10)
    assert (response.status_code, response.json()) == (200, 11)
    assert pub.rpc("standin_add", {"a": 2}, get=True).execute().data == 12
    response = httpx.get(
        f"{rest.url}/rest/v1/rpc/claim?worker=w",
        headers={
            "Accept-Profile": "pgqueue",
            "Authorization": f"Bearer {make_jwt('service_role')}",
        },
        timeout=10,
    )
    assert (response.status_code, response.json()["code"]) == (405, "25006")


def test_read_views_with_filters(rest, db):
    q = client(rest).schema("pgqueue")
    q.rpc(
        "enqueue_many",
        {"jobs": [{"kind": "a"}, {"kind": "a"}, {"kind": "b"}, {"kind": "c", "queue": "q2"}]},
    ).execute()
    stats = q.table("stats").select("*").execute().data
    by_kind = {(r["queue"], r["kind"]): r for r in stats}
    assert by_kind[("default", "a")]["jobs"] == 2
    assert by_kind[("default", "a")]["runnable"] == 2
    assert by_kind[("default", "a")]["status"] == "queued"
    assert by_kind[("q2", "c")]["jobs"] == 1
    assert len(stats) == 3

    rows = q.table("stats").select("kind,jobs").eq("queue", "default").order("kind", desc=True)
    assert rows.execute().data == [{"kind": "b", "jobs": 1}, {"kind": "a", "jobs": 2}]
    rows = q.table("stats").select("kind").in_("kind", ["a", "c"]).order("kind").limit(1)
    assert rows.execute().data == [{"kind": "a"}]
    rows = q.table("stats").select("kind").gt("jobs", 1).neq("kind", "zzz").execute()
    assert rows.data == [{"kind": "a"}]
    rows = q.table("stats").select("kind").is_("oldest_runnable_age", "null").execute()
    assert rows.data == []
    counted = q.table("stats").select("kind", count="exact").order("kind").range(1, 1).execute()
    assert counted.data == [{"kind": "b"}] and counted.count == 3
    single = q.table("stats").select("jobs").eq("kind", "b").single().execute()
    assert single.data == {"jobs": 1}
    with pytest.raises(APIError) as err:
        q.table("stats").select("jobs").single().execute()
    assert err.value.code == "PGRST116"
    with pytest.raises(APIError) as err:
        q.table("stats").select("no_such_column").execute()
    assert err.value.code == "42703"
    with pytest.raises(APIError) as err:
        q.table("no_such_view").select("*").execute()
    assert err.value.code == "PGRST205"


def test_concurrent_workers_claim_each_job_once(rest, db):
    """16 supabase-py workers claim and complete one job at a time through the stand-in."""
    total = 800
    q = client(rest).schema("pgqueue")
    q.rpc("enqueue_many", {"jobs": [{"kind": "load"}] * total}).execute()
    completed: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        try:
            wq = client(rest).schema("pgqueue")
            while True:
                rows = wq.rpc("claim", {"worker": f"w{n}"}).execute().data
                if not rows:
                    return
                (row,) = rows
                ok = wq.rpc("complete", {"job_id": row["id"], "lock_token": row["lock_token"]})
                assert ok.execute().data is True
                with lock:
                    completed.append(row["id"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    assert len(completed) == total
    assert len(set(completed)) == total
    assert db.execute("select count(*) from pgqueue.jobs where status = 'done'").fetchone() == (
        total,
    )
    calls = 2 * total + 16  # claim + complete per job, one empty claim per worker
    print(f"\nPostgREST stand-in: {calls / elapsed:.0f} rpc calls/s (claim/complete, 16 clients)")


def test_make_jwt_shape():
    import jwt

    claims = jwt.decode(make_jwt("anon", sub="x"), JWT_SECRET, algorithms=["HS256"])
    assert claims["iss"] == "supabase-demo"
    assert claims["role"] == "anon"
    assert claims["sub"] == "x"
    assert claims["exp"] > time.time() + 5 * 365 * 24 * 3600
