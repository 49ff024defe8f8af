"""STAND-IN for PostgREST 12 behind Supabase's gateway (`/rest/v1`), for tests only.

The Supabase stack cannot run here (no Docker), so supabase-py and supabase-js talk to this
small ASGI app instead. It copies PostgREST's documented behaviour for the part those
clients use against a queue: calling functions (`/rpc/<fn>`) and simple reads of tables and
views. It is not PostgREST: no inserts/updates/deletes, no resource embedding, no OpenAPI,
no `or`/`and` filter trees, no schema cache (functions are looked up on every request).

What it copies, per request:
- Auth: `Authorization: Bearer <jwt>` (or, without it, the `apikey` header, as Supabase's
  gateway passes it on) is verified as HS256/384/512 with the JWT secret; no token means the
  `anon` role, a bad token is a 401 with code PGRST301. The `role` claim is switched to with
  `set_config('role', ..., true)` inside the request's transaction, so the database's own
  privileges decide (a role the login role may not become fails with 42501).
- The transaction-scoped settings PostgREST sets: `search_path` (the selected schema, then
  `public, extensions` as Supabase configures `db-extra-search-path`), `request.jwt.claims`,
  `request.jwt.claim.role`, `request.method`, `request.path`, `request.headers`,
  `request.cookies`.
- Schema selection with `Accept-Profile` (GET/HEAD) and `Content-Profile` (other methods);
  the first exposed schema by default; any other schema is a 406 PGRST106.
- Functions are called with named arguments taken from the JSON body (POST) or the query
  string (GET), converted to the parameters' declared types by `json_to_record`, as
  PostgREST does (JSON arrays become Postgres arrays, objects become json/jsonb). A function
  with a single unnamed json/jsonb parameter gets the whole body. Only the given arguments
  are passed, so defaults apply. No matching function: 404 PGRST202; several: 300 PGRST203.
- Response shapes: scalar -> the JSON value; SETOF scalar -> array; SETOF composite / TABLE
  -> array of objects; a single composite -> object; void -> 204 without a body;
  `Accept: application/vnd.pgrst.object+json` -> one object, 406 PGRST116 (and a rollback)
  unless exactly one row. `Prefer: count=...` fills Content-Range's total.
- GET and HEAD run in a read-only transaction, as do POSTs to STABLE/IMMUTABLE functions
  (a write there fails with 25006 -> 405, like PostgREST's access mode).
- Errors: `{"code", "details", "hint", "message"}` with the SQLSTATE as code and the HTTP
  status from PostgREST's SQLSTATE table (42501 -> 401 for anon, 403 otherwise; 23505 ->
  409; P0001 -> 400; 42883/42P01 -> 404; ...; anything unlisted -> 400).
- Each request is one transaction: committed on success, rolled back on any error.

Connects with the given DSN (the real one connects as `authenticator`; the cluster
superuser works too, the role switch is real either way) through a small async pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import jwt
import psycopg
import uvicorn
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

JWT_SECRET = "super-secret-jwt-token-with-at-least-32-characters-long"
ANON_ROLE = "anon"
# Supabase's local stack: the demo keys expire in 2032 and carry iss "supabase-demo".
_FAR_FUTURE_EXP = 1983812996
_EXTRA_SEARCH_PATH = ("public", "extensions")
_JSON = "application/json"
_OBJECT = "application/vnd.pgrst.object+json"
_CT_JSON = "application/json; charset=utf-8"
_CT_OBJECT = "application/vnd.pgrst.object+json; charset=utf-8"
_RESERVED_PARAMS = {"select", "order", "limit", "offset", "columns", "on_conflict"}
_FILTER_OPS = {
    "eq": "=",
    "neq": "<>",
    "gt": ">",
    "gte": ">=",
    "lt": "<",
    "lte": "<=",
    "like": "like",
    "ilike": "ilike",
    "match": "~",
    "imatch": "~*",
}


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

    def response(self, head: bool = False) -> Response:
        content = b"" if head else json.dumps(self.body).encode()
        headers = {"Proxy-Status": f"PostgREST; error={self.body['code']}", **self.headers}
        return Response(content, self.status, headers=headers, media_type=_CT_JSON)


def _http_status(sqlstate: str, message: str, authed: bool) -> int:
    """PostgREST's SQLSTATE -> HTTP status table (src/PostgREST/Error.hs, mapSQLtoHTTP)."""
    exact = {
        "23503": 409,
        "23505": 409,
        "25006": 405,
        "53400": 500,
        "57P01": 503,
        "P0001": 400,
        "42P01": 404,
        "42P17": 500,
    }
    if sqlstate == "42501":
        return 403 if authed else 401
    if sqlstate == "42883":
        return 406 if message.startswith("function xmlagg(") else 404
    if sqlstate == "21000":
        return 400 if message.endswith("requires a WHERE clause") else 500
    if sqlstate == "22023":
        return 401 if message.startswith("role") and message.endswith("does not exist") else 400
    if sqlstate in exact:
        return exact[sqlstate]
    prefixes = {
        "08": 503,
        "09": 500,
        "0L": 403,
        "0P": 403,
        "25": 500,
        "28": 403,
        "2D": 500,
        "38": 500,
        "39": 500,
        "3B": 500,
        "40": 500,
        "53": 503,
        "54": 500,
        "55": 500,
        "57": 500,
        "58": 500,
        "F0": 500,
        "HV": 500,
        "P0": 500,
        "XX": 500,
    }
    if sqlstate[:2] in prefixes:
        return prefixes[sqlstate[:2]]
    if sqlstate.startswith("PT") and sqlstate[2:].isdigit():
        return int(sqlstate[2:])
    return 400


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
    token: str | None = None
    if authorization is not None:
        scheme, _, rest = authorization.strip().partition(" ")
        if scheme.lower() == "bearer":
            token = rest.strip()
            if not token:
                raise _jwt_error("Empty JWT is sent in Authorization header")
    elif request.headers.get("apikey"):
        token = request.headers["apikey"].strip()
    if token is None:
        return _Auth(ANON_ROLE, {"role": ANON_ROLE})
    parts = token.count(".") + 1
    if parts != 3:
        raise _jwt_error(f"Expected 3 parts in JWT; got {parts}")
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256", "HS384", "HS512"],
            options={"verify_aud": False},
            leeway=30,  # PostgREST allows 30 s of clock skew
        )
    except jwt.ExpiredSignatureError:
        raise _jwt_error("JWT expired") from None
    except jwt.ImmatureSignatureError as exc:
        issued = "iat" in str(exc)
        raise _jwt_error("JWT issued at future" if issued else "JWT not yet valid") from None
    except jwt.InvalidSignatureError:
        raise _jwt_error("JWSError JWSInvalidSignature") from None
    except jwt.InvalidAlgorithmError:
        raise _jwt_error("Wrong or unsupported encoding algorithm") from None
    except jwt.PyJWTError as exc:
        raise _jwt_error(f"JWSError {exc}") from None
    role = claims.get("role")
    if not isinstance(role, str) or not role:
        return _Auth(ANON_ROLE, claims)
    return _Auth(role, claims)


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


# --- request parsing ---------------------------------------------------------------------


def _media(request: Request) -> str:
    """The response media type from Accept: json or object (406 PGRST107 otherwise)."""
    accept = request.headers.get("accept")
    if not accept:
        return _JSON
    offered = []
    for item in accept.split(","):
        mime = item.split(";")[0].strip().lower()
        if mime in ("*/*", "application/*", _JSON):
            return _JSON
        if mime == _OBJECT:
            return _OBJECT
        offered.append(mime)
    raise PgrstError(
        406, "PGRST107", "None of these media types are available: " + ", ".join(offered)
    )


def _count_wanted(request: Request) -> bool:
    prefer = request.headers.get("prefer", "")
    return any(p.strip().startswith("count=") for p in prefer.split(","))


_SELECT_ITEM = re.compile(
    r"^(?:(?P<alias>[^:()\s]+):(?!:))?(?P<col>\*|[^:()\s]+)(?:::(?P<cast>[A-Za-z_][\w ]*))?$"
)


def _select_list(select: str | None) -> str:
    if not select or select.strip() == "*":
        return "*"
    items = []
    for raw in _split_top(select):
        item = raw.strip()
        m = _SELECT_ITEM.match(item)
        if not m:
            raise PgrstError(
                400,
                "PGRST100",
                f'"failed to parse select parameter ({select})"',
                "the PostgREST stand-in supports columns, aliases and casts only",
            )
        col = m["col"]
        expr = "*" if col == "*" else _ident(col)
        if m["cast"]:
            expr = f"{expr}::{m['cast']}"
        if m["alias"] or m["cast"]:
            expr += " as " + _ident(m["alias"] or col)
        items.append(expr)
    return ", ".join(items)


def _split_top(value: str) -> list[str]:
    """Split on commas outside double quotes and parentheses."""
    parts, current, depth, quoted = [], [], 0, False
    i = 0
    while i < len(value):
        ch = value[i]
        if quoted and ch == "\\" and i + 1 < len(value):
            current.append(value[i + 1])
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        if ch == "," and not quoted and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


@dataclass
class _Query:
    """WHERE / ORDER BY / LIMIT parts built from the query string, values as parameters."""

    where: list[str] = field(default_factory=list)
    order: str = ""
    limit: str = ""

    @staticmethod
    def value(v: Any) -> str:
        return _lit(str(v))

    def add_filter(self, column: str, spec: str) -> None:
        negate = False
        if spec.startswith("not."):
            negate, spec = True, spec[4:]
        op, dot, operand = spec.partition(".")
        col = _ident(column)
        if not dot:
            raise _filter_error(column, spec)
        if op in _FILTER_OPS:
            if op in ("like", "ilike"):
                operand = operand.replace("*", "%")
            cond = f"{col} {_FILTER_OPS[op]} {self.value(operand)}"
        elif op == "in":
            if not (operand.startswith("(") and operand.endswith(")")):
                raise _filter_error(column, spec)
            values = [_unquote(v) for v in _split_top(operand[1:-1])] if operand[1:-1] else []
            listed = ", ".join(self.value(v) for v in values)
            cond = f"{col} in ({listed})" if values else "false"
        elif op == "is":
            word = operand.lower()
            if word not in ("null", "true", "false", "unknown", "not_null"):
                raise _filter_error(column, spec)
            cond = f"{col} is not null" if word == "not_null" else f"{col} is {word}"
        else:
            raise _filter_error(column, spec)
        self.where.append(f"not ({cond})" if negate else cond)

    def set_order(self, spec: str) -> None:
        terms = []
        for raw in _split_top(spec):
            words = raw.strip().split(".")
            if not words[0]:
                continue
            term = _ident(_unquote(words[0]))
            for word in words[1:]:
                mods = {
                    "asc": " asc",
                    "desc": " desc",
                    "nullsfirst": " nulls first",
                    "nullslast": " nulls last",
                }
                if word not in mods:
                    raise PgrstError(
                        400, "PGRST100", f'"failed to parse order ({spec})"', f"unexpected {word}"
                    )
                term += mods[word]
            terms.append(term)
        self.order = " order by " + ", ".join(terms) if terms else ""

    def set_range(self, limit: str | None, offset: str | None) -> None:
        try:
            lim = int(limit) if limit not in (None, "") else None
            off = int(offset) if offset not in (None, "") else None
        except ValueError:
            raise PgrstError(
                400, "PGRST100", '"failed to parse limit/offset"', f"{limit!r} {offset!r}"
            ) from None
        if lim is not None and lim < 0:
            raise PgrstError(
                416,
                "PGRST103",
                "Requested range not satisfiable",
                "Limit should be greater than or equal to zero.",
            )
        self.limit = (f" limit {lim}" if lim is not None else "") + (
            f" offset {off}" if off else ""
        )

    def where_sql(self) -> str:
        return " where " + " and ".join(self.where) if self.where else ""


def _filter_error(column: str, spec: str) -> PgrstError:
    return PgrstError(
        400,
        "PGRST100",
        f'"failed to parse filter ({spec})" (line 1, column 1)',
        f"the PostgREST stand-in does not support this filter on {column}",
    )


def _read_query(request: Request, skip: set[str] = frozenset()) -> _Query:
    query = _Query()
    for key, value in request.query_params.multi_items():
        if key in skip or key in ("select", "columns", "on_conflict"):
            continue
        if key == "order":
            query.set_order(value)
        elif key in ("limit", "offset"):
            continue
        elif key in ("or", "and", "not.or", "not.and") or "." in key:
            raise PgrstError(
                400,
                "PGRST100",
                f'"failed to parse logic tree ({value})"',
                "the PostgREST stand-in supports plain column filters only",
            )
        else:
            query.add_filter(key, value)
    query.set_range(request.query_params.get("limit"), request.query_params.get("offset"))
    return query


# --- functions ---------------------------------------------------------------------------

_LOOKUP_SQL = """(
  select coalesce(json_agg(json_build_object(
           'name', p.proname,
           'returns_set', p.proretset,
           'volatility', p.provolatile,
           'returns_void', p.prorettype = 'void'::regtype,
           'returns_composite', t.typtype = 'c' or p.prorettype = 'record'::regtype,
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
class _Param:
    name: str
    type: str
    variadic: bool
    required: bool


@dataclass
class _Function:
    name: str
    returns_set: bool
    volatility: str
    returns_void: bool
    returns_composite: bool
    params: list[_Param]

    @classmethod
    def from_json(cls, f: dict[str, Any]) -> _Function:
        names, modes, types = f["arg_names"], f["arg_modes"], f["arg_types"]
        inputs = []
        for i, typ in enumerate(types):
            mode = modes[i] if modes else "i"
            if mode in ("i", "b", "v"):
                arg_name = names[i] if i < len(names) else ""
                inputs.append((arg_name, typ, mode == "v"))
        n_required = len(inputs) - f["n_defaults"]
        params = [_Param(n, t, v, required=i < n_required) for i, (n, t, v) in enumerate(inputs)]
        return cls(
            f["name"],
            f["returns_set"],
            f["volatility"],
            f["returns_void"],
            f["returns_composite"],
            params,
        )

    @property
    def names(self) -> set[str]:
        return {p.name for p in self.params if p.name}

    def accepts(self, keys: set[str]) -> bool:
        required = {p.name for p in self.params if p.required}
        return keys <= self.names and required <= keys and all(p.name for p in self.params)

    @property
    def single_json_param(self) -> bool:
        return (
            len(self.params) == 1
            and not self.params[0].name
            and self.params[0].type in ("json", "jsonb")
        )


def _singularity_error(n: int) -> PgrstError:
    return PgrstError(
        406,
        "PGRST116",
        "JSON object requested, multiple (or no) rows returned",
        f"The result contains {n} rows",
    )


def _no_function(
    schema: str, name: str, keys: list[str], post_json: bool, hint: str | None
) -> PgrstError:
    func = f"{schema}.{name}"
    if keys:
        message = f"Could not find the function {func}({', '.join(keys)}) in the schema cache"
        searched = f" with parameter{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
    else:
        message = f"Could not find the function {func} without parameters in the schema cache"
        searched = " without parameters"
    if post_json:
        searched += " or with a single unnamed json/jsonb parameter"
    details = (
        f"Searched for the function {func}{searched},"
        " but no matches were found in the schema cache."
    )
    return PgrstError(404, "PGRST202", message, details, hint)


# --- the app -----------------------------------------------------------------------------


class PostgRESTStandIn:
    """See the module docstring: PostgREST's RPC subset, served by uvicorn in a thread."""

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
        self.pool_size = pool_size
        self.url = ""
        self.requests = 0
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
        )

    # lifecycle

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        yield
        await self._pool.close()

    def start(self) -> PostgRESTStandIn:
        if self._thread is not None:
            return self
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
        # listening socket says TCP, and without it every response waits ~40 ms (Nagle +
        # delayed ACK) between uvicorn's separate header and body writes.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
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
        self.requests += 1
        head = request.method == "HEAD"
        try:
            return await self._route(request)
        except PgrstError as exc:
            return exc.response(head)

    async def _route(self, request: Request) -> Response:
        path = request.path_params["path"].strip("/")
        method = request.method
        auth = _authenticate(request, self.jwt_secret)
        if method in ("GET", "HEAD"):
            profile = request.headers.get("accept-profile")
        else:
            profile = request.headers.get("content-profile")
        schema = profile if profile is not None else self.schemas[0]
        if schema not in self.schemas:
            raise PgrstError(
                406,
                "PGRST106",
                "The schema must be one of the following: " + ", ".join(self.schemas),
            )
        media = _media(request)
        if path.startswith("rpc/"):
            if method not in ("GET", "HEAD", "POST"):
                raise PgrstError(405, "PGRST101", f"Cannot use the {method} method on RPC")
            return await self._rpc(request, auth, schema, media, path[4:])
        if not path or "/" in path:
            raise PgrstError(404, "PGRST125", "Invalid path specified in request URL")
        if method not in ("GET", "HEAD"):
            raise PgrstError(
                501,
                "PGRST127",
                "Feature not implemented",
                f"the PostgREST stand-in serves reads only, not {method} on tables",
            )
        return await self._read(request, auth, schema, media, path)

    def _begin_sql(self, request: Request, auth: _Auth, schema: str, read_only: str) -> str:
        """`begin` and PostgREST's transaction settings, as one round trip; `read_only` is
        an SQL expression giving 'on' or 'off'. Callers append select-list items."""
        path_schemas = dict.fromkeys((schema, *_EXTRA_SEARCH_PATH))
        settings = {
            "search_path": ", ".join(_ident(s) for s in path_schemas),
            "role": auth.role,
            "request.jwt.claims": json.dumps(auth.claims),
            "request.jwt.claim.role": auth.role,
            "request.method": request.method,
            "request.path": "/" + request.path_params["path"],
            "request.headers": json.dumps({k.lower(): v for k, v in request.headers.items()}),
            "request.cookies": json.dumps(dict(request.cookies)),
        }
        items = [f"set_config({_lit(k)}, {_lit(v)}, true)" for k, v in settings.items()]
        items.append(f"set_config('transaction_read_only', {read_only}, true)")
        return "begin; select " + ", ".join(items)

    async def _run(self, auth: _Auth, work) -> Any:
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

    @staticmethod
    async def _first_row(cur: psycopg.AsyncCursor, statement: int) -> tuple:
        for _ in range(statement):
            cur.nextset()
        row = await cur.fetchone()
        assert row is not None
        return row

    async def _rpc(
        self, request: Request, auth: _Auth, schema: str, media: str, name: str
    ) -> Response:
        method = request.method
        body_text: str | None = None
        args: Any = {}
        if method == "POST":
            raw = await request.body()
            content_type = request.headers.get("content-type", _JSON).split(";")[0].strip()
            if content_type == "application/x-www-form-urlencoded":
                args = dict(parse_qsl(raw.decode()))
            else:
                try:
                    args = json.loads(raw) if raw.strip() else {}
                except ValueError as exc:
                    raise PgrstError(400, "PGRST102", "Empty or invalid json", str(exc)) from None
                body_text = raw.decode() if raw.strip() else "{}"
        count_wanted = _count_wanted(request)
        if method == "POST":
            read_only = (
                "case when (select bool_and(p.provolatile in ('s', 'i'))"
                " from pg_catalog.pg_proc as p"
                " join pg_catalog.pg_namespace as n on n.oid = p.pronamespace"
                f" where n.nspname = {_lit(schema)} and p.proname = {_lit(name)})"
                " then 'on' else 'off' end"
            )
        else:
            read_only = "'on'"
        begin = self._begin_sql(request, auth, schema, read_only)
        begin += ", " + _LOOKUP_SQL.format(schema=_lit(schema), name=_lit(name))

        async def work(conn: AsyncConnection) -> Response:
            cur = await conn.execute(begin)
            (lookup,) = (await self._first_row(cur, 1))[-1:]
            candidates = [_Function.from_json(f) for f in lookup]
            payload = args
            if method != "POST":
                arg_names = set().union(*(f.names for f in candidates)) if candidates else set()
                payload = {}
                for key, value in request.query_params.multi_items():
                    if key in arg_names:
                        prev = payload.get(key)
                        if prev is None:
                            payload[key] = value
                        else:
                            payload[key] = (
                                [*prev, value] if isinstance(prev, list) else [prev, value]
                            )
            if isinstance(payload, dict):
                keys = set(payload)
                matches = [f for f in candidates if f.accepts(keys)]
            else:
                keys, matches = set(), []
            single_json = False
            if not matches and method == "POST" and body_text is not None:
                matches = [f for f in candidates if f.single_json_param]
                single_json = bool(matches)
            if not matches:
                hint = await self._function_hint(conn, schema, name, keys, candidates)
                raise _no_function(schema, name, sorted(keys), method == "POST", hint)
            if len(matches) > 1:
                listed = ", ".join(
                    f"{schema}.{name}({', '.join(f'{p.name} => {p.type}' for p in f.params)})"
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
            sql, singular = self._call_sql(
                request, fn, schema, media, payload, body_text, single_json, count_wanted
            )
            if fn.returns_void:
                await conn.execute(sql + "; commit")
                return Response(status_code=204)
            cur = await conn.execute(sql if singular else sql + "; commit")
            body, n, total_n = await self._first_row(cur, 0)
            if singular and n != 1:
                raise _singularity_error(n)
            if singular:
                await conn.execute("commit")
            limit = request.query_params.get("limit") if fn.returns_composite else None
            return self._ok(request, body, n, total_n, media, limit)

        return await self._run(auth, work)

    @staticmethod
    def _call_sql(
        request: Request,
        fn: _Function,
        schema: str,
        media: str,
        payload: Any,
        body_text: str | None,
        single_json: bool,
        count_wanted: bool,
    ) -> tuple[str, bool]:
        """The statement calling fn the way PostgREST does, and whether one row is wanted."""
        ctes: list[str] = []
        call_args: list[str] = []
        if single_json:
            call_args = [f"{_lit(body_text or '{}')}::{fn.params[0].type}"]
        elif payload:
            given = [p for p in fn.params if p.name in payload]
            args_json = body_text if body_text is not None else json.dumps(payload)
            columns = ", ".join(f"{_ident(p.name)} {p.type}" for p in given)
            ctes.append(
                f"pgrst_args as (select * from json_to_record({_lit(args_json)}::json)"
                f" as pgrst_a({columns}))"
            )
            call_args = [
                ("variadic " if p.variadic else "")
                + f"{_ident(p.name)} := pgrst_args.{_ident(p.name)}"
                for p in given
            ]
        call = f"{_ident(schema)}.{_ident(fn.name)}({', '.join(call_args)})"
        from_args = "pgrst_args, " if ctes else ""
        if fn.returns_void:
            if ctes:
                return f"with {ctes[0]} select {call} from pgrst_args", False
            return f"select {call}", False

        query = _Query()
        if fn.returns_composite:
            source = f"select pgrst_call.* from {from_args}lateral {call} as pgrst_call"
            skip = set(payload) if request.method != "POST" and isinstance(payload, dict) else set()
            query = _read_query(request, skip)
            select = _select_list(request.query_params.get("select"))
            inner = (
                f"select {select} from pgrst_source{query.where_sql()}{query.order}{query.limit}"
            )
            one = "json_agg(_t)->0"
            many = "coalesce(json_agg(_t), '[]')"
        elif fn.returns_set:
            source = (
                f"select pgrst_call.pgrst_scalar from {from_args}"
                f"lateral {call} as pgrst_call(pgrst_scalar)"
            )
            inner = "select pgrst_scalar from pgrst_source"
            one = "json_agg(_t.pgrst_scalar)->0"
            many = "coalesce(json_agg(_t.pgrst_scalar), '[]')"
        else:
            source = f"select {call} as pgrst_scalar" + (" from pgrst_args" if ctes else "")
            inner = "select pgrst_scalar from pgrst_source"
            one = many = "json_agg(_t.pgrst_scalar)->0"
        ctes.append(f"pgrst_source as ({source})")
        singular = media == _OBJECT
        body_expr = many if fn.returns_set and not singular else f"coalesce(({one})::text, 'null')"
        total = (
            f"(select count(*) from pgrst_source{query.where_sql()})"
            if count_wanted
            else "null::bigint"
        )
        sql = (
            f"with {', '.join(ctes)} select ({body_expr})::text, count(*), {total}"
            f" from ({inner}) as _t"
        )
        return sql, singular

    async def _function_hint(
        self,
        conn: AsyncConnection,
        schema: str,
        name: str,
        keys: set[str],
        candidates: list[_Function],
    ) -> str | None:
        prefix = f"Perhaps you meant to call the function {schema}."
        if candidates:
            options = {"(" + ", ".join(sorted(f.names)) + ")": f for f in candidates if f.names}
            given = "(" + ", ".join(sorted(keys)) + ")"
            best = difflib.get_close_matches(given, list(options), n=1, cutoff=0.33)
            return prefix + name + best[0] if best else None
        cur = await conn.execute(
            "select distinct p.proname from pg_catalog.pg_proc as p"
            " join pg_catalog.pg_namespace as n on n.oid = p.pronamespace"
            f" where n.nspname = {_lit(schema)} and p.prokind = 'f'"
        )
        names = [r[0] for r in await cur.fetchall()]
        best = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
        return prefix + best[0] if best else None

    async def _read(
        self, request: Request, auth: _Auth, schema: str, media: str, table: str
    ) -> Response:
        query = _read_query(request)
        select = _select_list(request.query_params.get("select"))
        count_wanted = _count_wanted(request)
        begin = self._begin_sql(request, auth, schema, "'on'") + (
            ", exists (select from pg_catalog.pg_class as c"
            " join pg_catalog.pg_namespace as n on n.oid = c.relnamespace"
            f" where n.nspname = {_lit(schema)} and c.relname = {_lit(table)}"
            " and c.relkind in ('r', 'v', 'm', 'f', 'p'))"
        )
        relation = f"{_ident(schema)}.{_ident(table)}"
        singular = media == _OBJECT
        agg = (
            "coalesce((json_agg(_t)->0)::text, 'null')"
            if singular
            else "coalesce(json_agg(_t), '[]')::text"
        )
        total = (
            f"(select count(*) from {relation}{query.where_sql()})"
            if count_wanted
            else "null::bigint"
        )
        sql = (
            f"select {agg}, count(*), {total} from (select {select} from {relation}"
            f"{query.where_sql()}{query.order}{query.limit}) as _t"
        )

        async def work(conn: AsyncConnection) -> Response:
            cur = await conn.execute(begin)
            (exists,) = (await self._first_row(cur, 1))[-1:]
            if not exists:
                raise PgrstError(
                    404,
                    "PGRST205",
                    f"Could not find the table '{schema}.{table}' in the schema cache",
                )
            cur = await conn.execute(sql + "; commit")
            body, n, total_n = await self._first_row(cur, 0)
            if singular and n != 1:
                raise _singularity_error(n)
            return self._ok(request, body, n, total_n, media, request.query_params.get("limit"))

        return await self._run(auth, work)

    @staticmethod
    def _ok(
        request: Request, body: str, n: int, total: int | None, media: str, limit: str | None
    ) -> Response:
        offset = int(request.query_params.get("offset") or 0) if limit else 0
        total_s = "*" if total is None else str(total)
        content_range = f"{offset}-{offset + n - 1}/{total_s}" if n else f"*/{total_s}"
        status = 206 if total is not None and n < total and n else 200
        headers = {"Content-Range": content_range}
        content = b"" if request.method == "HEAD" else body.encode()
        media_type = _CT_OBJECT if media == _OBJECT else _CT_JSON
        return Response(content, status, headers=headers, media_type=media_type)
