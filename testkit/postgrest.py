"""STAND-IN for PostgREST 12 behind Supabase's gateway (`/rest/v1`), for tests and benchmarks.

There is no Supabase stack here (no Docker), so supabase-py and supabase-js talk to this small
ASGI app instead. It serves what the generated projects call through them, and nothing more:

- `POST /rest/v1/rpc/<function>`: a queue function with named arguments in a JSON body
  (`client.schema(s).rpc(fn, args)`), optionally with `select=` naming columns of the rows it
  returns, cast or not (the Python transport's complete_and_claim asks for
  `payload::text`);
- `GET /rest/v1/<table or view>` with `select=` (`*` or columns), `order=`, `limit=` and
  comparison filters (`column=eq.value`, and `neq`, `gt`, `gte`, `lt`, `lte`): the CLI reads
  `stats`, `unclaimed` and `dead_letters` so, the dashboard the retrying jobs
  (`jobs?status=eq.queued&attempts=gt.0`).

Anything else a client can send (other methods and paths, other filters, `offset`, embedding,
`Prefer: count=...`, `.single()`'s object media type) is answered 501 PGRST127, naming this
stand-in: a test that comes to need more fails loudly instead of getting an answer PostgREST
would not give.

What it does as PostgREST does, per request:
- CORS: any origin, as PostgREST allows by default (a browser's preflight is answered).
- Auth: `Authorization: Bearer <jwt>` is verified as HS256 with the JWT secret; no header
  means the `anon` role; a malformed, forged or expired token is 401 PGRST301.
- The role switch: inside the request's transaction, `role` becomes the token's `role` claim
  and `request.jwt.claims` its claims (what `auth.role()` and `auth.uid()` read), so the
  database's own grants decide; a role the login role may not become is refused by the
  database (42501). `search_path` is the request's schema, then `public, extensions`.
- The schema: `Content-Profile` (POST) or `Accept-Profile` (GET), else the first exposed one;
  any other is 406 PGRST106.
- RPC: only the arguments given are passed (defaults apply), converted to the parameters'
  declared types by `json_to_record` (a JSON array becomes a Postgres array). No function of
  that name takes exactly those arguments: 404 PGRST202; several do: 300 PGRST203. A STABLE or
  IMMUTABLE function runs in a read-only transaction (a write fails: 25006, 405), as do reads.
- Shapes: a scalar is its JSON value; SETOF a scalar is an array; SETOF a row type (or TABLE)
  is an array of objects; a single row is an object; void is 204 with no body.
- Errors: `{"code", "details", "hint", "message"}`, the SQLSTATE as code, the HTTP status from
  PostgREST's table (a function's `raise sqlstate 'PT429'` sets status 429, as PostgREST
  documents for `PTxyz`). Each request is one transaction: committed on success, rolled back on
  any error.

It logs in with the DSN it is given (the real one logs in as `authenticator`) through a small
connection pool.

Tests start it as `PostgRESTStandIn(dsn)`; by hand (to run a rendered project's worker, its
Edge Function or its tests against it), `python -m testkit.postgrest --db-url URL --port N`
serves it until interrupted and prints its URL and keys as `supabase status -o env` names them
(docs/testing.md, "Starting the PostgREST stand-in by hand").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jwt
import psycopg
import uvicorn
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

JWT_SECRET = "super-secret-jwt-token-with-at-least-32-characters-long"
ANON_ROLE = "anon"
# Supabase's local stack: the demo keys expire in 2032 and carry iss "supabase-demo".
_FAR_FUTURE_EXP = 1983812996
_EXTRA_SEARCH_PATH = ("public", "extensions")
_JSON = "application/json; charset=utf-8"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def make_jwt(role: str, secret: str = JWT_SECRET, **claims: Any) -> str:
    """A token like the Supabase local stack's anon / service_role keys (HS256)."""
    payload = {"iss": "supabase-demo", "role": role, "exp": _FAR_FUTURE_EXP, **claims}
    return jwt.encode(payload, secret, algorithm="HS256")


class PgrstError(Exception):
    """An HTTP error answered in PostgREST's JSON shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        hint: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"code": code, "details": details, "hint": hint, "message": message}
        self.headers = headers or {}

    def response(self) -> Response:
        headers = {"Proxy-Status": f"PostgREST; error={self.body['code']}", **self.headers}
        return Response(json.dumps(self.body), self.status, headers=headers, media_type=_JSON)


def _not_served(what: str) -> PgrstError:
    return PgrstError(
        501,
        "PGRST127",
        "Feature not implemented",
        f"the PostgREST stand-in (testkit/postgrest.py) does not serve {what}",
    )


# PostgREST's SQLSTATE -> HTTP status table (src/PostgREST/Error.hs), less the entries for
# features this stand-in does not serve.
_STATUS = {"23503": 409, "23505": 409, "25006": 405, "42883": 404, "42P01": 404, "P0001": 400}
_STATUS_OF_CLASS = {
    **dict.fromkeys(("08", "53"), 503),
    **dict.fromkeys(("0L", "0P", "28"), 403),
    **dict.fromkeys(("09", "25", "2D", "38", "39", "3B", "40", "54", "55", "57", "58"), 500),
    **dict.fromkeys(("F0", "HV", "P0", "XX"), 500),
}


def _http_status(sqlstate: str, message: str, authed: bool) -> int:
    if re.fullmatch(r"PT[0-9]{3}", sqlstate):  # `raise sqlstate 'PT429'`: that HTTP status
        return int(sqlstate[2:])
    if sqlstate == "42501":  # insufficient privilege: not logged in, or not allowed
        return 403 if authed else 401
    if sqlstate == "22023" and message.startswith("role") and message.endswith("does not exist"):
        return 401  # the token names a role the database does not have
    return _STATUS.get(sqlstate) or _STATUS_OF_CLASS.get(sqlstate[:2], 400)


def _db_error(exc: psycopg.Error, authed: bool) -> PgrstError:
    diag = exc.diag
    sqlstate = diag.sqlstate or exc.sqlstate or ""
    if not sqlstate:
        return PgrstError(503, "PGRST000", "Database connection error.", str(exc))
    message = diag.message_primary or str(exc)
    status = _http_status(sqlstate, message, authed)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return PgrstError(
        status, sqlstate, message, diag.message_detail, diag.message_hint, headers=headers
    )


def _ident(name: str) -> str:
    """A quoted SQL identifier."""
    if "\x00" in name:
        raise PgrstError(400, "PGRST100", "NUL characters are not allowed", repr(name))
    return '"' + name.replace('"', '""') + '"'


def _lit(value: str) -> str:
    """A quoted SQL string literal, of type unknown like an untyped parameter.

    Queries are sent as text with their values inlined (never through psycopg's parameter
    syntax, so `%` is not special), which lets one round trip carry several statements:
    `begin; <settings>` and `<call>; commit`. standard_conforming_strings is always on.
    """
    if "\x00" in value:
        raise PgrstError(400, "PGRST100", "NUL characters are not allowed", repr(value))
    return "'" + value.replace("'", "''") + "'"


# --- authentication ----------------------------------------------------------------------


@dataclass
class _Auth:
    role: str
    claims: dict[str, Any]

    @property
    def authed(self) -> bool:
        return self.role != ANON_ROLE


def _jwt_error(message: str) -> PgrstError:
    header = f'Bearer error="invalid_token", error_description={json.dumps(message)}'
    return PgrstError(401, "PGRST301", message, headers={"WWW-Authenticate": header})


def _authenticate(request: Request, secret: str) -> _Auth:
    authorization = request.headers.get("authorization")
    if authorization is None:
        return _Auth(ANON_ROLE, {"role": ANON_ROLE})
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _jwt_error("Expected a bearer token in the Authorization header")
    try:
        claims = jwt.decode(
            token.strip(),
            secret,
            algorithms=["HS256"],
            options={"verify_aud": False},
            leeway=30,  # PostgREST allows 30 s of clock skew
        )
    except jwt.ExpiredSignatureError:
        raise _jwt_error("JWT expired") from None
    except jwt.InvalidSignatureError:
        raise _jwt_error("JWSError JWSInvalidSignature") from None
    except jwt.PyJWTError as exc:
        raise _jwt_error(f"JWSError {exc}") from None
    role = claims.get("role")
    return _Auth(role if isinstance(role, str) and role else ANON_ROLE, claims)


# --- a small async connection pool (psycopg_pool is not installed here) -------------------


class _Pool:
    def __init__(self, dsn: str, size: int) -> None:
        self._dsn = dsn
        self._size = size
        self._idle: list[AsyncConnection] = []
        self._count = 0
        self._cond: asyncio.Condition | None = None

    async def acquire(self) -> AsyncConnection:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            while not self._idle and self._count >= self._size:
                await self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return await AsyncConnection.connect(
                self._dsn, autocommit=True, application_name="postgrest-standin"
            )
        except BaseException:
            async with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    async def release(self, conn: AsyncConnection) -> None:
        assert self._cond is not None
        healthy = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
        if not healthy:
            with contextlib.suppress(Exception):
                await conn.close()
        async with self._cond:
            if healthy:
                self._idle.append(conn)
            else:
                self._count -= 1
            self._cond.notify()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close()


# --- the query string --------------------------------------------------------------------


def _refuse_what_is_not_served(request: Request, params: set[str]) -> None:
    """501 for query parameters other than `params`, and for headers asking for a count or a
    media type other than JSON."""
    extra = sorted(set(request.query_params) - params)
    if extra:
        raise _not_served(f"the query parameter(s) {', '.join(extra)}")
    accept = request.headers.get("accept")
    if accept and not any(m in accept for m in ("*/*", "application/json")):
        raise _not_served(f"Accept: {accept}")
    prefer = request.headers.get("prefer", "")
    if "count=" in prefer:
        raise _not_served(f"Prefer: {prefer}")


def _select_list(select: str | None) -> str:
    """`*`, or columns with optional casts (`id,payload::text`); a cast column keeps its name,
    as in PostgREST."""
    if select is None or select.strip() == "*":
        return "*"
    items = []
    for item in select.split(","):
        column, _, cast = item.strip().partition("::")
        if not _IDENTIFIER.fullmatch(column) or (cast and not _IDENTIFIER.fullmatch(cast)):
            raise _not_served(f"select={select} (only *, columns and casts)")
        items.append(f"{_ident(column)}::{cast} as {_ident(column)}" if cast else _ident(column))
    return ", ".join(items)


_ORDER_MODIFIERS = {
    "asc": " asc",
    "desc": " desc",
    "nullsfirst": " nulls first",
    "nullslast": " nulls last",
}


def _order_by(order: str | None) -> str:
    """`order=queue.asc,kind.desc.nullslast` as an ORDER BY clause."""
    if not order:
        return ""
    terms = []
    for term in order.split(","):
        column, *modifiers = term.strip().split(".")
        if not _IDENTIFIER.fullmatch(column) or any(m not in _ORDER_MODIFIERS for m in modifiers):
            raise PgrstError(400, "PGRST100", f'"failed to parse order ({order})"')
        terms.append(_ident(column) + "".join(_ORDER_MODIFIERS[m] for m in modifiers))
    return " order by " + ", ".join(terms)


_COMPARISONS = {"eq": "=", "neq": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
# Query parameters that are not filters; the ones not served are refused.
_RESERVED = {"select", "order", "limit", "offset", "columns", "on_conflict", "and", "or", "not"}


def _filters(request: Request) -> str:
    """`status=eq.queued&attempts=gt.0` as a WHERE clause; the value is an untyped literal, so
    Postgres reads it as the column's type, as PostgREST has it."""
    terms = []
    for column, condition in request.query_params.multi_items():
        if column in _RESERVED:
            continue
        operator, dot, value = condition.partition(".")
        if not _IDENTIFIER.fullmatch(column) or not dot:
            raise PgrstError(400, "PGRST100", f'"failed to parse filter ({condition})"')
        if operator not in _COMPARISONS:
            raise _not_served(f"the filter {operator}. (only {', '.join(_COMPARISONS)})")
        terms.append(f"{_ident(column)} {_COMPARISONS[operator]} {_lit(value)}")
    return " where " + " and ".join(terms) if terms else ""


def _limit(limit: str | None) -> str:
    if limit is None:
        return ""
    if not limit.isdigit():
        raise PgrstError(400, "PGRST100", f'"failed to parse limit ({limit})"')
    return f" limit {int(limit)}"


# --- functions ---------------------------------------------------------------------------

_LOOKUP_SQL = """(
  select coalesce(json_agg(json_build_object(
           'returns_set', p.proretset,
           'read_only', p.provolatile in ('s', 'i'),
           'returns_void', p.prorettype = 'void'::regtype,
           'returns_row', t.typtype = 'c' or p.prorettype = 'record'::regtype,
           'arg_names', coalesce(p.proargnames, '{{}}'::text[]),
           'arg_modes', coalesce(p.proargmodes::text[], '{{}}'::text[]),
           'arg_types', array(
             select format_type(a.oid, null)
             from unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]))
               with ordinality as a(oid, n)
             order by a.n),
           'n_defaults', p.pronargdefaults)), '[]')
  from pg_catalog.pg_proc as p
  join pg_catalog.pg_namespace as n on n.oid = p.pronamespace
  join pg_catalog.pg_type as t on t.oid = p.prorettype
  where n.nspname = {schema} and p.proname = {name} and p.prokind = 'f'
)"""


@dataclass
class _Function:
    """One function of the requested name, as pg_proc describes it."""

    returns_set: bool
    read_only: bool
    returns_void: bool
    returns_row: bool
    # input parameters: (name, type), and how many of the first ones have no default
    params: list[tuple[str, str]]
    n_required: int

    @classmethod
    def from_json(cls, f: dict[str, Any]) -> _Function:
        names, modes, types = f["arg_names"], f["arg_modes"], f["arg_types"]
        params = [
            (names[i] if i < len(names) else "", typ)
            for i, typ in enumerate(types)
            if not modes or modes[i] in ("i", "b", "v")  # not OUT parameters or TABLE columns
        ]
        return cls(
            f["returns_set"],
            f["read_only"],
            f["returns_void"],
            f["returns_row"],
            params,
            len(params) - f["n_defaults"],
        )

    def accepts(self, names: set[str]) -> bool:
        """Whether a call with exactly these argument names reaches this function."""
        required = {name for name, _ in self.params[: self.n_required]}
        named = {name for name, _ in self.params}
        return all(named) and required <= names <= named

    def call_sql(self, schema: str, name: str, body: str, args: set[str], select: str) -> str:
        """The statement that calls it with the JSON body's arguments and returns its result
        as JSON text (or nothing, for void)."""
        given = [(n, t) for n, t in self.params if n in args]
        call_args = ", ".join(f"{_ident(n)} := pgrst_args.{_ident(n)}" for n, _ in given)
        call = f"{_ident(schema)}.{_ident(name)}({call_args})"
        with_args = from_args = ""
        if given:
            columns = ", ".join(f"{_ident(n)} {t}" for n, t in given)
            with_args = (
                f"with pgrst_args as (select * from json_to_record({_lit(body)}::json)"
                f" as pgrst_a({columns})) "
            )
            from_args = "pgrst_args, "
        if self.returns_row:
            rows = (
                f"select {select} from (select pgrst_call.* from {from_args}lateral {call}"
                " as pgrst_call) as pgrst_rows"
            )
            result = "coalesce(json_agg(r), '[]')" if self.returns_set else "json_agg(r)->0"
            return f"{with_args}select coalesce(({result})::text, 'null') from ({rows}) as r"
        if select != "*":
            raise _not_served("select= on a function that returns no rows")
        if self.returns_set:
            return (
                f"{with_args}select coalesce(json_agg(r.v), '[]')::text"
                f" from {from_args}lateral {call} as r(v)"
            )
        value = call if self.returns_void else f"coalesce(to_json({call})::text, 'null')"
        return f"{with_args}select {value}" + (" from pgrst_args" if given else "")


def _no_function(schema: str, name: str, args: list[str]) -> PgrstError:
    func = f"{schema}.{name}"
    if args:
        message = f"Could not find the function {func}({', '.join(args)}) in the schema cache"
        searched = f" with parameter{'s' if len(args) > 1 else ''} {', '.join(args)}"
    else:
        message = f"Could not find the function {func} without parameters in the schema cache"
        searched = " without parameters"
    details = (
        f"Searched for the function {func}{searched},"
        " but no matches were found in the schema cache."
    )
    return PgrstError(404, "PGRST202", message, details)


async def _row(cur: psycopg.AsyncCursor, statement: int = 0) -> tuple:
    """The first row of the statement-th result of a multi-statement query."""
    for _ in range(statement):
        cur.nextset()
    row = await cur.fetchone()
    assert row is not None
    return row


# --- the app -----------------------------------------------------------------------------


class PostgRESTStandIn:
    """See the module docstring: PostgREST's RPC and simple reads, served by uvicorn in a
    thread."""

    def __init__(
        self,
        dsn: str,
        jwt_secret: str = JWT_SECRET,
        schemas: tuple[str, ...] = ("public", "pgqueue"),
        pool_size: int = 10,
    ) -> None:
        if not schemas:
            raise ValueError("at least one schema must be exposed")
        self.dsn = dsn
        self.jwt_secret = jwt_secret
        self.schemas = tuple(schemas)
        self.url = ""
        # How often each function was called through /rpc, for tests that count round trips.
        self.rpc_calls: collections.Counter[str] = collections.Counter()
        self._pool = _Pool(dsn, pool_size)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[
                Route(
                    "/rest/v1/{path:path}",
                    self._handle,
                    methods=["GET", "HEAD", "POST", "PATCH", "PUT", "DELETE"],
                )
            ],
            lifespan=self._lifespan,
            # PostgREST's default CORS: any origin, so an app's page calls the Data API itself
            middleware=[
                Middleware(
                    CORSMiddleware,
                    allow_origins=["*"],
                    allow_methods=["GET", "HEAD", "POST", "PATCH", "PUT", "DELETE", "OPTIONS"],
                    allow_headers=["*"],
                    expose_headers=["Content-Encoding", "Content-Location", "Content-Range"],
                )
            ],
        )

    # lifecycle

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        yield
        await self._pool.close()

    def start(self, port: int = 0) -> PostgRESTStandIn:
        """Serve on 127.0.0.1:`port` (0: any free port; `url` says which)."""
        if self._thread is not None:
            return self
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
        # listening socket says TCP, and without it every response waits ~40 ms (Nagle +
        # delayed ACK) between uvicorn's separate header and body writes.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=30
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="PostgREST stand-in",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the PostgREST stand-in did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._server = None
        self._thread = None

    def __enter__(self) -> PostgRESTStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # requests

    async def _handle(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except PgrstError as exc:
            return exc.response()

    async def _route(self, request: Request) -> Response:
        path = request.path_params["path"].strip("/")
        auth = _authenticate(request, self.jwt_secret)
        post = request.method == "POST"
        profile = request.headers.get("content-profile" if post else "accept-profile")
        schema = profile if profile is not None else self.schemas[0]
        if schema not in self.schemas:
            raise PgrstError(
                406,
                "PGRST106",
                "The schema must be one of the following: " + ", ".join(self.schemas),
            )
        if post and path.startswith("rpc/"):
            return await self._rpc(request, auth, schema, path.removeprefix("rpc/"))
        if request.method == "GET" and path and "/" not in path:
            return await self._read(request, auth, schema, path)
        raise _not_served(f"{request.method} /rest/v1/{path}")

    def _begin_sql(self, auth: _Auth, schema: str, read_only: bool) -> str:
        """`begin` and the request's transaction settings, as one statement that callers
        append select-list items to."""
        search_path = dict.fromkeys((schema, *_EXTRA_SEARCH_PATH))
        settings = {
            "search_path": ", ".join(map(_ident, search_path)),
            "role": auth.role,
            "request.jwt.claims": json.dumps(auth.claims),
        } | ({"transaction_read_only": "on"} if read_only else {})
        items = ", ".join(f"set_config({_lit(k)}, {_lit(v)}, true)" for k, v in settings.items())
        return f"begin; select {items}"

    async def _run(
        self, auth: _Auth, work: Callable[[AsyncConnection], Awaitable[Response]]
    ) -> Response:
        """Run work(conn), which begins and commits its transaction; on any error the
        transaction is rolled back and database errors become PostgREST errors."""
        try:
            conn = await self._pool.acquire()
        except psycopg.Error as exc:
            raise PgrstError(503, "PGRST000", "Database connection error.", str(exc)) from None
        try:
            try:
                return await work(conn)
            finally:
                if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute("rollback")
        except psycopg.Error as exc:
            raise _db_error(exc, auth.authed) from None
        finally:
            await self._pool.release(conn)

    async def _rpc(self, request: Request, auth: _Auth, schema: str, name: str) -> Response:
        _refuse_what_is_not_served(request, {"select"})
        self.rpc_calls[name] += 1
        raw = await request.body()
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise PgrstError(400, "PGRST102", "Empty or invalid json", str(exc)) from None
        if not isinstance(args, dict):
            raise _not_served("a function called with a JSON body that is not an object")
        select = _select_list(request.query_params.get("select"))
        lookup = _LOOKUP_SQL.format(schema=_lit(schema), name=_lit(name))
        begin = f"{self._begin_sql(auth, schema, read_only=False)}, {lookup}"

        async def work(conn: AsyncConnection) -> Response:
            found = (await _row(await conn.execute(begin), 1))[-1]
            matches = [f for f in map(_Function.from_json, found) if f.accepts(set(args))]
            if not matches:
                raise _no_function(schema, name, sorted(args))
            if len(matches) > 1:
                listed = ", ".join(
                    f"{schema}.{name}({', '.join(f'{n} => {t}' for n, t in f.params)})"
                    for f in matches
                )
                raise PgrstError(
                    300,
                    "PGRST203",
                    f"Could not choose the best candidate function between: {listed}",
                    None,
                    "Try renaming the parameters or the function itself in the database so"
                    " function overloading can be resolved",
                )
            fn = matches[0]
            sql = fn.call_sql(schema, name, raw.decode() or "{}", set(args), select)
            if fn.read_only:
                sql = f"set transaction read only; {sql}"
            cur = await conn.execute(f"{sql}; commit")
            if fn.returns_void:
                return Response(status_code=204)
            (body,) = await _row(cur, 1 if fn.read_only else 0)
            return Response(body, 200, media_type=_JSON)

        return await self._run(auth, work)

    async def _read(self, request: Request, auth: _Auth, schema: str, table: str) -> Response:
        filtered = set(request.query_params) - _RESERVED
        _refuse_what_is_not_served(request, {"select", "order", "limit", *filtered})
        select = _select_list(request.query_params.get("select"))
        where = _filters(request)
        order = _order_by(request.query_params.get("order"))
        limit = _limit(request.query_params.get("limit"))
        begin = self._begin_sql(auth, schema, read_only=True) + (
            ", exists (select from pg_catalog.pg_class as c"
            " join pg_catalog.pg_namespace as n on n.oid = c.relnamespace"
            f" where n.nspname = {_lit(schema)} and c.relname = {_lit(table)}"
            " and c.relkind in ('r', 'v', 'm', 'f', 'p'))"
        )
        relation = f"{_ident(schema)}.{_ident(table)}"
        sql = (
            f"select coalesce(json_agg(r), '[]')::text"
            f" from (select {select} from {relation}{where}{order}{limit}) as r"
        )

        async def work(conn: AsyncConnection) -> Response:
            exists = (await _row(await conn.execute(begin), 1))[-1]
            if not exists:
                raise PgrstError(
                    404,
                    "PGRST205",
                    f"Could not find the table '{schema}.{table}' in the schema cache",
                )
            (body,) = await _row(await conn.execute(f"{sql}; commit"))
            return Response(body, 200, media_type=_JSON)

        return await self._run(auth, work)


# --- by hand ------------------------------------------------------------------------------


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.postgrest",
        description="Serve the PostgREST stand-in (Supabase's /rest/v1) over a PostgreSQL "
        "database on 127.0.0.1 until interrupted, printing its URL and keys as "
        "`supabase status -o env` names them.",
    )
    parser.add_argument(
        "--db-url",
        required=True,
        help="the database, logged in as PostgREST's login role, e.g. "
        "postgresql://authenticator@127.0.0.1:5432/postgres",
    )
    parser.add_argument(
        "--port", type=int, default=3000, help="the port to serve on (default 3000; 0: any)"
    )
    parser.add_argument(
        "--schema",
        action="append",
        help="a schema to expose, the first one the default (repeat it; default: public, pgqueue)",
    )
    parser.add_argument(
        "--jwt-secret",
        default=JWT_SECRET,
        help="the HS256 secret of the JWTs (Supabase's local one)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m testkit.postgrest`: see _arguments(); 1 when it cannot start."""
    args = _arguments(argv)
    try:
        psycopg.connect(args.db_url, connect_timeout=10).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())  # one line
        print(f"error: cannot connect to {args.db_url}: {reason}", file=sys.stderr)
        return 1
    api = PostgRESTStandIn(
        args.db_url, jwt_secret=args.jwt_secret, schemas=tuple(args.schema or ("public", "pgqueue"))
    )
    try:
        api.start(port=args.port)
    except OSError as exc:
        print(f"error: cannot serve on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"PostgREST stand-in on {api.url}/rest/v1 until interrupted", file=sys.stderr)
    print(f'API_URL="{api.url}"')
    print(f'ANON_KEY="{make_jwt(ANON_ROLE, args.jwt_secret)}"')
    print(f'SERVICE_ROLE_KEY="{make_jwt("service_role", args.jwt_secret)}"', flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
