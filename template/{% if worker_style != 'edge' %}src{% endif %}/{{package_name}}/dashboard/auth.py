# Dashboard machinery: you should not need to edit this file.
"""Who may use the dashboard: one password, sessions, and CSRF tokens.

A correct password opens a session: a random id, kept in this process's memory and sent as a
cookie signed (HMAC-SHA256) with a key drawn when the process starts. Neither the password nor
anything derived from it ever leaves the server, and a restart logs everyone out.

Every form that changes something carries a token: HMAC(key, session id + the form's action).
A POST is accepted only with its token, and never from another site (the browser's
Sec-Fetch-Site and Origin headers say where a request comes from).
"""

from __future__ import annotations

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
        if not cookie or cookie.count(".") != 1:
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
        return token is not None and hmac.compare_digest(token, self.csrf_token(sid, action))

    def _sign(self, purpose: str, *parts: str) -> str:
        message = "\n".join((purpose, *parts)).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


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
