"""The PostgREST stand-in (testkit/postgrest.py), driven by the real supabase-py client (raw
HTTP where a status code is the point): exactly what the generated projects call through it.
RPC with its shapes and errors, the role switch, reads with select/order/limit and comparison
filters; everything else is refused with 501."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import httpx
import jwt
import pytest
from postgrest import CountMethod
from postgrest.exceptions import APIError
from supabase import Client, ClientOptions, create_client

from testkit.cluster import Cluster, free_port
from testkit.postgrest import JWT_SECRET, PostgRESTStandIn, make_jwt
from tests.support.jobs import job

# Functions the tests create in `public` (exposed, default privileges to the API roles).
HELPERS_SQL = """
create table public.standin_log (id serial primary key, note text not null);
create function public.standin_whoami(note text default null)
returns jsonb language sql volatile as $$
  select jsonb_build_object(
    'current_user', current_user,
    'claims', current_setting('request.jwt.claims', true)::jsonb,
    'auth_role', auth.role(),
    'auth_uid', auth.uid(),
    'search_path', current_setting('search_path'),
    'read_only', current_setting('transaction_read_only'),
    'note', note)
$$;
create function public.standin_add(a integer, b integer default 10)
returns integer language sql stable as $$ select a + b $$;
create function public.standin_pair(x integer, out doubled integer, out label text)
language sql immutable as $$ select x * 2, 'n' || x $$;
create sequence public.standin_seq;
create function public.standin_next_in_a_stable_function() returns bigint
language sql stable as $$ select nextval('public.standin_seq') $$;
create function public.standin_raise(sqlstate text) returns void language plpgsql as $$
begin
  raise exception 'raised %', sqlstate using errcode = sqlstate;
end
$$;
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
create function public.standin_twin(a integer) returns integer language sql as $$ select a $$;
create function public.standin_twin(a text) returns text language sql as $$ select a $$;
"""
HELPERS_DROP = """
drop function if exists public.standin_whoami(text), public.standin_add(integer, integer),
  public.standin_pair(integer), public.standin_next_in_a_stable_function(),
  public.standin_raise(text), public.standin_log_then_fail(text), public.standin_unique(),
  public.standin_twin(integer), public.standin_twin(text);
drop table if exists public.standin_log;
drop sequence if exists public.standin_seq;
"""

# Every queue function the generated projects call, with arguments of the right names.
QUEUE_CALLS = {
    "enqueue": {"kind": "email"},
    "enqueue_many": {"jobs": [{"kind": "email"}]},
    "claim": {"worker": "w1"},
    "complete_and_claim": {"worker": "w1", "done_ids": [1], "done_tokens": [str(uuid.uuid4())]},
    "complete": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "complete_many": {"job_ids": [1], "lock_tokens": [str(uuid.uuid4())]},
    "fail": {"job_id": 1, "lock_token": str(uuid.uuid4()), "error": "boom"},
    "heartbeat": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "heartbeat_many": {"job_ids": [1], "lock_tokens": [str(uuid.uuid4())], "lease_seconds": 30},
    "release": {"job_id": 1, "lock_token": str(uuid.uuid4())},
    "retry": {"job_id": 1},
    "cancel": {"job_id": 1},
    "checkin": {"worker": "w1", "queue": "default", "kinds": ["email"]},
    "configure": {},
    "health": {},
    "sweep": {},
}
READ_VIEWS = ("stats", "unclaimed", "dead_letters")


@pytest.fixture(scope="module")
def standin(postgrest: PostgRESTStandIn, stack: Cluster) -> Iterator[PostgRESTStandIn]:
    """The session's stand-in, with the helper functions in `public`."""
    with stack.connect(autocommit=True) as conn:
        conn.execute(HELPERS_DROP)
        conn.execute(HELPERS_SQL)
    yield postgrest
    with stack.connect(autocommit=True) as conn:
        conn.execute(HELPERS_DROP)


def client(standin: PostgRESTStandIn, role: str = "service_role", **claims) -> Client:
    """supabase-py as the generated code makes it, with a key for `role`."""
    return create_client(
        standin.url, make_jwt(role, **claims), options=ClientOptions(schema="pgqueue")
    )


def post(standin: PostgRESTStandIn, fn: str, body: object, token: str | None = None, **headers):
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.setdefault("Content-Profile", "pgqueue")
    return httpx.post(f"{standin.url}/rest/v1/rpc/{fn}", json=body, headers=headers, timeout=10)


def service_role() -> str:
    return make_jwt("service_role")


def public() -> dict[str, str]:
    """The headers that call a function of `public` instead of the queue's schema."""
    return {"Content-Profile": "public"}


# --- RPC and its shapes -------------------------------------------------------------------


def test_rpc_answers_in_the_shape_of_what_the_function_returns(standin, db):
    q = client(standin).schema("pgqueue")
    # bigint -> a JSON number
    job_id = q.rpc("enqueue", {"kind": "email", "payload": {"to": "a@example.com"}}).execute()
    assert isinstance(job_id.data, int)
    assert job(db, job_id.data)["status"] == "queued"
    # setof bigint -> an array, from a JSON array argument (jsonb)
    ids = q.rpc("enqueue_many", {"jobs": [{"kind": "a"}, {"kind": "a"}]}).execute().data
    assert isinstance(ids, list) and len(ids) == 2 and all(isinstance(i, int) for i in ids)
    # setof a row type -> an array of objects; select= picks and casts columns, and a cast
    # column keeps its name (the Python transport takes the payload as JSON text); `queue` is
    # an argument's name too
    claimed = (
        q.rpc("claim", {"worker": "w1", "max_jobs": 5, "kinds": ["email"], "queue": "default"})
        .select("id", "queue", "payload::text", "attempts", "lock_token")
        .execute()
        .data
    )
    assert claimed == [
        {
            "id": job_id.data,
            "queue": "default",
            "payload": '{"to": "a@example.com"}',
            "attempts": 1,
            "lock_token": str(job(db, job_id.data)["lock_token"]),
        }
    ]
    # all columns without select=
    (row,) = q.rpc("claim", {"worker": "w2", "max_jobs": 1}).execute().data
    assert row["id"] in ids
    assert (row["locked_by"], row["status"], row["payload"]) == ("w2", "running", {})
    # boolean -> true/false
    lease = {"job_id": job_id.data, "lock_token": claimed[0]["lock_token"]}
    assert q.rpc("complete", lease).execute().data is True
    assert q.rpc("complete", lease).execute().data is False
    # text -> a JSON string; an interval argument from a string
    failed = q.rpc(
        "fail",
        {"job_id": row["id"], "lock_token": row["lock_token"], "error": "x", "retry_in": "1 min"},
    ).execute()
    assert failed.data == "queued"
    # returns table (...) -> an array of objects
    [swept] = q.rpc("sweep", {}).execute().data
    assert swept.keys() == {"rescued", "dead_lettered", "pruned", "woke"}
    assert isinstance(swept["woke"], bool)
    # jsonb -> the object itself
    config = q.rpc("configure", {}).execute().data
    assert isinstance(config, dict) and isinstance(config["lease_seconds"], int)
    # void -> 204 without a body (supabase-py makes that an empty list)
    checkin = {"worker": "standin-w1", "queue": "default", "kinds": ["email"]}
    assert q.rpc("checkin", checkin).execute().data == []
    response = post(standin, "checkin", {**checkin, "kinds": ["sms"]}, service_role())
    assert (response.status_code, response.content) == (204, b"")
    checked_in = db.execute("select kinds from pgqueue.workers where worker = 'standin-w1'")
    assert checked_in.fetchall() == [(["sms"],)]
    # nothing left to claim: an empty array, not null
    assert q.rpc("claim", {"worker": "w1", "kinds": ["email"]}).execute().data == []
    # one row of OUT parameters -> an object
    pub = client(standin).schema("public")
    assert pub.rpc("standin_pair", {"x": 4}).execute().data == {"doubled": 8, "label": "n4"}


def test_arrays_become_postgres_arrays_and_defaults_apply_to_arguments_left_out(standin, db):
    q = client(standin).schema("pgqueue")
    ids = q.rpc("enqueue_many", {"jobs": [{"kind": "a"}, {"kind": "b"}, {"kind": "a"}]})
    ids = ids.execute().data
    claimed = q.rpc("claim", {"worker": "w", "max_jobs": 10, "kinds": ["a"]}).execute().data
    assert sorted(r["id"] for r in claimed) == [ids[0], ids[2]]
    # lease_seconds left out: the lease the database is configured with
    (configured,) = db.execute("select (pgqueue.configure() ->> 'lease_seconds')::int").fetchone()
    for row in claimed:
        locked_at, locked_until = map(
            datetime.fromisoformat, (row["locked_at"], row["locked_until"])
        )
        assert (locked_until - locked_at).total_seconds() == configured
    stale = str(uuid.uuid4())
    done = q.rpc(
        "complete_many",
        {
            "job_ids": [claimed[0]["id"], claimed[1]["id"]],
            "lock_tokens": [claimed[0]["lock_token"], stale],
        },
    ).execute()
    assert done.data == [claimed[0]["id"]]
    assert job(db, claimed[1]["id"])["status"] == "running"
    pub = client(standin).schema("public")
    assert pub.rpc("standin_add", {"a": 1}).execute().data == 11
    assert pub.rpc("standin_add", {"a": 1, "b": 2}).execute().data == 3


def test_the_hot_path_takes_arrays_and_answers_with_its_table(standin, db):
    """complete_and_claim as the Python transport calls it: arrays of ids and tokens in, the
    rows of a RETURNS TABLE out, the payload cast to text by select=."""
    q = client(standin).schema("pgqueue")
    jobs = [{"kind": "hot", "payload": {"n": n}} for n in (1, 2)]
    first, second = q.rpc("enqueue_many", {"jobs": jobs}).execute().data
    columns = ("id", "kind", "payload::text", "attempts", "max_attempts", "lock_token")

    def complete_and_claim(**args: object) -> list[dict]:
        request = q.rpc("complete_and_claim", {"worker": "w", "kinds": ["hot"], **args})
        return request.select(*columns).execute().data

    [claimed] = complete_and_claim(max_jobs=1)
    assert (claimed["id"], claimed["kind"], claimed["payload"]) == (first, "hot", '{"n": 1}')
    assert claimed["attempts"] == 1
    [after] = complete_and_claim(
        done_ids=[first],
        done_tokens=[claimed["lock_token"]],
        max_jobs=1,
        queue="default",
        lease_seconds=30,
    )
    assert after["id"] == second
    assert job(db, first)["status"] == "done"
    # max_jobs 0 only completes: no rows, an empty array
    assert (
        complete_and_claim(done_ids=[second], done_tokens=[after["lock_token"]], max_jobs=0) == []
    )
    assert job(db, second)["status"] == "done"


def test_rpc_errors_keep_the_sqlstate_and_roll_back(standin, db):
    sb = client(standin)
    with pytest.raises(APIError) as err:
        sb.schema("public").rpc("standin_log_then_fail", {"note": "n1"}).execute()
    assert err.value.json() == {
        "code": "P0001",
        "details": "some detail",
        "hint": "try again",
        "message": "refused: n1",
    }
    assert db.execute("select count(*) from public.standin_log").fetchone() == (0,)
    response = post(standin, "standin_log_then_fail", {"note": "n2"}, service_role(), **public())
    assert (response.status_code, response.json()["code"]) == (400, "P0001")
    response = post(standin, "standin_unique", {}, service_role(), **public())
    assert (response.status_code, response.json()["code"]) == (409, "23505")
    # the queue's own refusals, and values Postgres cannot cast to the parameter's type
    q = sb.schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.rpc("claim", {"worker": "w", "max_jobs": 0}).execute()
    assert (err.value.code, err.value.message) == (
        "22023",
        "max_jobs must be between 1 and 10000, got 0",
    )
    with pytest.raises(APIError) as err:
        q.rpc("complete", {"job_id": 1, "lock_token": "not-a-uuid"}).execute()
    assert err.value.code == "22P02"
    response = post(standin, "enqueue_many", {"jobs": {"kind": "x"}}, service_role())
    assert (response.status_code, response.json()["code"]) == (400, "22023")
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (0,)


def test_a_stable_function_runs_read_only(standin):
    pub = client(standin).schema("public")
    with pytest.raises(APIError) as err:
        pub.rpc("standin_next_in_a_stable_function", {}).execute()
    assert (err.value.code, err.value.message) == (
        "25006",
        "cannot execute nextval() in a read-only transaction",
    )
    response = post(standin, "standin_next_in_a_stable_function", {}, service_role(), **public())
    assert response.status_code == 405
    me = pub.rpc("standin_whoami", {}).execute().data  # volatile: read-write
    assert me["read_only"] == "off"


@pytest.mark.parametrize(
    ("sqlstate", "status"),
    [
        ("P0001", 400),
        ("22012", 400),
        ("23503", 409),
        ("23505", 409),
        ("25006", 405),
        ("42883", 404),
        ("42P01", 404),
        ("42501", 403),
        ("28000", 403),
        ("08006", 503),
        ("53300", 503),
        ("40001", 500),
        ("57014", 500),
        ("XX000", 500),
    ],
)
def test_http_status_from_the_sqlstate(standin, sqlstate, status):
    """PostgREST's table, for the SQLSTATE classes the stand-in maps."""
    response = post(standin, "standin_raise", {"sqlstate": sqlstate}, service_role(), **public())
    assert response.status_code == status
    assert response.json()["code"] == sqlstate


def test_no_function_with_those_arguments_is_404_and_two_are_300(standin):
    q = client(standin).schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.rpc("no_such_function", {"a": 1}).execute()
    assert err.value.code == "PGRST202"
    assert err.value.message == (
        "Could not find the function pgqueue.no_such_function(a) in the schema cache"
    )
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
        client(standin).schema("public").rpc("claim", {"worker": "w"}).execute()
    assert err.value.code == "PGRST202"
    response = post(standin, "standin_twin", {"a": 1}, service_role(), **public())
    assert (response.status_code, response.json()["code"]) == (300, "PGRST203")


def test_a_schema_that_is_not_exposed_is_406(standin):
    with pytest.raises(APIError) as err:
        client(standin).schema("vault").rpc("create_secret", {"new_secret": "s"}).execute()
    assert err.value.code == "PGRST106"
    response = httpx.get(
        f"{standin.url}/rest/v1/jobs",
        headers={"Accept-Profile": "auth", "Authorization": f"Bearer {service_role()}"},
        timeout=10,
    )
    assert response.status_code == 406
    assert response.json()["message"] == "The schema must be one of the following: public, pgqueue"


def test_a_database_it_cannot_reach_is_503_pgrst000() -> None:
    """What the generated code's transport takes for "unavailable, retry later"."""
    with PostgRESTStandIn(f"postgresql://authenticator@127.0.0.1:{free_port()}/postgres") as api:
        response = post(api, "claim", {"worker": "w"}, service_role())
    assert (response.status_code, response.json()["code"]) == (503, "PGRST000")


# --- the role switch ----------------------------------------------------------------------


def test_the_tokens_role_is_switched_to_and_its_claims_are_set(standin):
    sub = "11111111-1111-1111-1111-111111111111"
    me = client(standin, "authenticated", sub=sub).schema("public")
    me = me.rpc("standin_whoami", {"note": "hi"}).execute().data
    assert me["current_user"] == "authenticated"
    assert (me["claims"]["role"], me["claims"]["sub"]) == ("authenticated", sub)
    assert (me["auth_role"], me["auth_uid"]) == ("authenticated", sub)
    assert me["search_path"] == '"public", "extensions"'
    assert me["note"] == "hi"
    them = client(standin).schema("public").rpc("standin_whoami", {}).execute().data
    assert (them["current_user"], them["auth_role"], them["auth_uid"]) == (
        "service_role",
        "service_role",
        None,
    )
    # no token: anon
    response = httpx.post(
        f"{standin.url}/rest/v1/rpc/standin_whoami", json={}, headers=public(), timeout=10
    )
    assert response.json()["current_user"] == "anon"


@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_api_roles_are_refused_every_queue_function_and_view(standin, db, role):
    q = client(standin, role).schema("pgqueue")
    for fn, args in QUEUE_CALLS.items():
        with pytest.raises(APIError) as err:
            q.rpc(fn, args).execute()
        assert err.value.code == "42501", (fn, err.value.json())
        assert "permission denied" in (err.value.message or ""), fn
        response = post(standin, fn, args, make_jwt(role))
        assert response.status_code == (401 if role == "anon" else 403), fn
    for view in READ_VIEWS:
        with pytest.raises(APIError) as err:
            q.table(view).select("*").execute()
        assert err.value.code == "42501", view
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (0,)


def test_without_a_token_the_queue_is_refused_as_anon(standin, db):
    response = post(standin, "enqueue", {"kind": "x"})
    assert (response.status_code, response.json()["code"]) == (401, "42501")
    assert response.headers["www-authenticate"] == "Bearer"
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (0,)


def test_bad_tokens_are_401_pgrst301(standin, db):
    forged = make_jwt("service_role", secret="another-secret-that-is-at-least-32-chars")
    sb = create_client(standin.url, forged, options=ClientOptions(schema="pgqueue"))
    with pytest.raises(APIError) as err:
        sb.schema("pgqueue").rpc("enqueue", {"kind": "x"}).execute()
    assert err.value.code == "PGRST301"
    expired = make_jwt("service_role", exp=int(time.time()) - 3600)
    for token, message in [
        (forged, "JWSError JWSInvalidSignature"),
        (expired, "JWT expired"),
        ("not-a-jwt", None),
    ]:
        response = post(standin, "enqueue", {"kind": "x"}, token)
        assert response.status_code == 401, token
        body = response.json()
        assert set(body) == {"code", "details", "hint", "message"}
        assert body["code"] == "PGRST301"
        assert message is None or body["message"] == message
        assert "invalid_token" in response.headers["www-authenticate"]
    response = post(standin, "enqueue", {"kind": "x"}, Authorization=f"Basic {service_role()}")
    assert (response.status_code, response.json()["code"]) == (401, "PGRST301")
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (0,)


def test_roles_the_login_role_cannot_become_are_refused(standin):
    # authenticator is not a member of postgres: the database refuses the switch
    response = post(standin, "enqueue", {"kind": "x"}, make_jwt("postgres"))
    assert (response.status_code, response.json()["code"]) == (403, "42501")
    response = post(standin, "enqueue", {"kind": "x"}, make_jwt("nobody_at_all"))
    assert (response.status_code, response.json()["code"]) == (401, "22023")


def test_make_jwt_is_shaped_like_the_local_stacks_keys():
    claims = jwt.decode(make_jwt("anon", sub="x"), JWT_SECRET, algorithms=["HS256"])
    assert claims["iss"] == "supabase-demo"
    assert claims["role"] == "anon"
    assert claims["sub"] == "x"
    assert claims["exp"] > time.time() + 5 * 365 * 24 * 3600


# --- reads --------------------------------------------------------------------------------


def test_reads_of_the_views_with_select_order_and_limit(standin, db):
    q = client(standin).schema("pgqueue")
    q.rpc(
        "enqueue_many",
        {"jobs": [{"kind": "a"}, {"kind": "a"}, {"kind": "b"}, {"kind": "c", "queue": "q2"}]},
    ).execute()
    # as the CLI reads them: select=*, ordered, dead letters limited
    stats = q.table("stats").select("*").order("queue").order("kind").execute().data
    assert [(r["queue"], r["kind"], r["jobs"]) for r in stats] == [
        ("default", "a", 2),
        ("default", "b", 1),
        ("q2", "c", 1),
    ]
    assert stats[0]["status"] == "queued" and stats[0]["runnable"] == 2
    unclaimed = q.table("unclaimed").select("*").order("queue").order("kind").execute().data
    assert [(r["queue"], r["kind"]) for r in unclaimed] == [
        ("default", "a"),
        ("default", "b"),
        ("q2", "c"),
    ]
    for queue in ("default", "q2"):  # every job dead-lettered
        claimed = db.execute(
            "select id, lock_token from pgqueue.claim('w', 10, queue => %s)", (queue,)
        )
        for job_id, token in claimed.fetchall():
            db.execute("select pgqueue.fail(%s, %s, 'x', retryable => false)", (job_id, token))
    dead = q.table("dead_letters").select("*").limit(3).execute().data
    assert len(dead) == 3 and {r["last_error"] for r in dead} == {"x"}
    assert q.table("dead_letters").select("*").limit(0).execute().data == []
    # columns, descending order
    rows = q.table("stats").select("kind", "jobs").order("kind", desc=True).execute().data
    assert rows == [{"kind": "c", "jobs": 1}, {"kind": "b", "jobs": 1}, {"kind": "a", "jobs": 2}]


def test_reads_with_comparison_filters(standin, db):
    """As the dashboard lists the jobs waiting to retry: `jobs?status=eq.queued&attempts=gt.0`;
    values are read as the column's type."""
    q = client(standin).schema("pgqueue")
    ids = q.rpc("enqueue_many", {"jobs": [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}]}).execute()
    first, second, third = ids.data
    [(token,)] = db.execute(
        "select lock_token from pgqueue.claim('w', 1, kinds => array['a'])"
    ).fetchall()
    assert db.execute("select pgqueue.fail(%s, %s, 'boom')", (first, token)).fetchone() == (
        "queued",
    )
    db.execute("select pgqueue.claim('w', 1, kinds => array['b'])")
    retrying = (
        q.table("jobs")
        .select("id", "attempts", "last_error")
        .eq("status", "queued")
        .gt("attempts", 0)
        .execute()
        .data
    )
    assert retrying == [{"id": first, "attempts": 1, "last_error": "boom"}]
    # (live_jobs: a view, with the running jobs the claims hold)
    rows = q.table("live_jobs").select("id").neq("status", "running").lte("id", third).order("id")
    assert [r["id"] for r in rows.execute().data] == [first, third]
    assert [
        r["id"]
        for r in q.table("live_jobs").select("id").gte("id", second).lt("id", third).execute().data
    ] == [second]
    response = httpx.get(
        f"{standin.url}/rest/v1/jobs?id=eq",
        headers={"Accept-Profile": "pgqueue", "Authorization": f"Bearer {service_role()}"},
        timeout=10,
    )
    assert (response.status_code, response.json()["code"]) == (400, "PGRST100")


def test_read_errors(standin):
    q = client(standin).schema("pgqueue")
    with pytest.raises(APIError) as err:
        q.table("no_such_view").select("*").execute()
    assert err.value.code == "PGRST205"
    with pytest.raises(APIError) as err:
        q.table("stats").select("no_such_column").execute()
    assert err.value.code == "42703"
    response = httpx.get(
        f"{standin.url}/rest/v1/stats?order=kind.sideways",
        headers={"Accept-Profile": "pgqueue", "Authorization": f"Bearer {service_role()}"},
        timeout=10,
    )
    assert (response.status_code, response.json()["code"]) == (400, "PGRST100")


# --- what is not served ---------------------------------------------------------------------


def test_what_the_generated_code_does_not_call_is_refused_with_501(standin, db):
    q = client(standin).schema("pgqueue")
    not_served = {
        "a pattern filter": q.table("stats").select("*").like("kind", "a%"),
        "an or filter": q.table("stats").select("*").or_("kind.eq.a,kind.eq.b"),
        "offset": q.table("stats").select("*").offset(1),
        "a count": q.table("stats").select("*", count=CountMethod.exact),
        "one object": q.table("stats").select("*").limit(1).single(),
        "an embedded resource": q.table("stats").select("kind,jobs(id)"),
        "an insert": q.table("jobs").insert({"kind": "a"}),
        "an update": q.table("jobs").update({"kind": "a"}).eq("id", 1),
        "a delete": q.table("jobs").delete().eq("id", 1),
        "an RPC over GET": q.rpc("health", {}, get=True),
        "a filter on an RPC": q.rpc("health", {}).eq("ok", True),
    }
    for what, request in not_served.items():
        with pytest.raises(APIError) as err:
            request.execute()
        assert err.value.code == "PGRST127", what
        assert "testkit/postgrest.py" in (err.value.details or ""), what
    assert db.execute("select count(*) from pgqueue.all_jobs").fetchone() == (0,)


# --- under load ---------------------------------------------------------------------------


def test_concurrent_clients_claim_each_job_once(standin, db):
    """16 supabase-py workers claim and complete one job at a time through the stand-in: each
    request is its own transaction, on a connection of the pool."""
    total = 800
    q = client(standin).schema("pgqueue")
    ids = q.rpc("enqueue_many", {"jobs": [{"kind": "load"}] * total}).execute().data
    completed: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        try:
            wq = client(standin).schema("pgqueue")
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
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert sorted(completed) == sorted(ids)
    done = db.execute("select count(*) from pgqueue.all_jobs where status = 'done'").fetchone()
    assert done == (total,)
