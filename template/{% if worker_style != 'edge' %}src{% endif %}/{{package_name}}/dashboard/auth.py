# Dashboard machinery: you should not need to edit this file.
"""Who may use the dashboard: one password, sessions, and CSRF tokens.

A correct password opens a session: a random id, kept in this process's memory and sent as a
cookie signed (HMAC-SHA256) with a key drawn when the process starts. Neither the password nor
anything derived from it ever leaves the server, and a restart logs everyone out.

Every form that changes something carries a token: HMAC(key, session id + the form's action).
A POST is accepted only with its token, and never from another site (the browser's
Sec-Fetch-Site and Origin headers say where a request comes from). A cookie or token that is
not ASCII text is none we made, and refused as such.

Passwords are checked one at a time, and a wrong one holds up the next check (LoginThrottle),
so guessing goes no faster by sending many at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE = "dashboard_session"
SESSION_SECONDS = 12 * 3600
# Sessions kept at most; the oldest go first (each login adds one).
MAX_SESSIONS = 1000
# Login attempts that may wait for their turn at once (the one being checked included); more
# are turned away at once. A person logs in once; only a flood of guesses waits in line.
MAX_WAITING_LOGINS = 4


class Guard:
    """Checks the password, keeps the sessions and signs the CSRF tokens."""

    def __init__(
        self,
        password: str,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = secrets.token_bytes(32)
        # Compared as digests, so the comparison takes as long whatever the length typed.
        self._password = _digest(password)
        self._lifetime = lifetime
        self._clock = clock
        self._sessions: dict[str, float] = {}  # id -> when it expires

    def password_matches(self, attempt: str) -> bool:
        return hmac.compare_digest(_digest(attempt), self._password)

    def open_session(self) -> str:
        """A new session; returns the cookie's value."""
        now = self._clock()
        self._sessions = {sid: expires for sid, expires in self._sessions.items() if expires > now}
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        sid = secrets.token_urlsafe(32)
        expires = now + self._lifetime
        self._sessions[sid] = expires
        return f"{sid}.{self._sign('session', sid)}"

    def session(self, cookie: str | None) -> str | None:
        """The session id a cookie carries, when it is signed by us and still open."""
        if not cookie or not cookie.isascii() or cookie.count(".") != 1:
            return None
        sid, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign("session", sid)):
            return None
        expires = self._sessions.get(sid)
        if expires is None or expires <= self._clock():
            return None
        return sid

    def close_session(self, sid: str) -> None:
        self._sessions.pop(sid, None)

    def csrf_token(self, sid: str, action: str) -> str:
        """The token a form posting to `action` (a path) carries in this session."""
        return self._sign("csrf", sid, action)

    def csrf_ok(self, sid: str, action: str, token: str | None) -> bool:
        return (
            token is not None
            and token.isascii()
            and hmac.compare_digest(token, self.csrf_token(sid, action))
        )

    def _sign(self, purpose: str, *parts: str) -> str:
        message = "\n".join((purpose, *parts)).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


class LoginThrottle:
    """Checks passwords one at a time, the next no sooner than `delay` seconds after a wrong
    one: guesses sent at once are checked no faster than guesses sent one after another, and
    a client that hangs up while it waits gains nothing (the pause belongs to the next
    check, not to the wrong one's answer). At most `max_waiting` attempts wait their turn;
    check() turns away the others at once."""

    def __init__(
        self,
        delay: float,
        max_waiting: int = MAX_WAITING_LOGINS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._delay = delay
        self._max_waiting = max_waiting
        self._clock = clock
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._next_check = 0.0  # clock() reading before which no password is checked

    async def check(self, matches: Callable[[], bool]) -> bool | None:
        """What `matches()` (the password comparison) says, asked in turn; None when
        `max_waiting` attempts are waiting already."""
        if self._waiting >= self._max_waiting:
            return None
        self._waiting += 1
        try:
            async with self._turn:
                pause = self._next_check - self._clock()
                if pause > 0:
                    await asyncio.sleep(pause)
                right = matches()
                if not right:
                    self._next_check = self._clock() + self._delay
                return right
        finally:
            self._waiting -= 1


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def from_another_site(request: Request) -> bool:
    """True when the browser says the request comes from another site (a page elsewhere
    posting a form here). Browsers send Sec-Fetch-Site with every request, and it is the
    answer; older ones send Origin with a POST. Under our Referrer-Policy (no-referrer) a
    browser may send `Origin: null` even from our own page, so null counts only without
    Sec-Fetch-Site. A client that sends neither is no browser: the CSRF token still guards
    it."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    # Only the host and port: behind a proxy that ends TLS, the scheme we see is http.
    return origin == "null" or urlsplit(origin).netloc != request.headers.get("host")
