# Dashboard machinery: you should not need to edit this file.
"""The queue's web dashboard: each queue's depth and state, throughput, dead letters and
retrying jobs, the job list (filtered, a page at a time), one job's detail, and the buttons to
retry, cancel (one job, or the filtered set after a confirmation), pause and resume.

Server-rendered HTML (Starlette and Jinja2), plain forms, no script in the page. It needs a
password to open (auth.py) and talks to the queue only through a QueueSource (source.py), so
this folder depends on nothing else in the project. Serve it on localhost and reach it through
an SSH tunnel or `fly proxy`: never on a public address without TLS in front.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import Guard
from .source import QueueSource
from .views import Views

__all__ = ["QueueSource", "create_app"]

STYLESHEET = Path(__file__).parent / "static" / "dashboard.css"

# What every response says to the browser: run no script, load nothing from elsewhere, post
# forms only here, never inside a frame, send no Referer, keep no copy.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_app(
    source: QueueSource, password: str, *, title: str = "Queue", login_delay: float = 1.0
) -> Starlette:
    """The dashboard over `source`, opened by `password`. Passwords are checked one at a time;
    after a wrong one the next waits `login_delay` seconds, and so does the wrong one's answer.
    A few attempts may wait their turn; more at once are answered 429."""
    if not password:
        raise ValueError("the dashboard needs a password")
    views = Views(source, Guard(password), title, login_delay)
    pages = [
        ("/", views.overview, "GET"),
        ("/login", views.login_page, "GET"),
        ("/login", views.login, "POST"),
        ("/logout", views.logout, "POST"),
        ("/jobs", views.find_job, "GET"),
        ("/jobs/{job_id}", views.job, "GET"),
        ("/jobs/{job_id}/retry", views.retry, "POST"),
        ("/jobs/{job_id}/cancel", views.cancel, "POST"),
        ("/queues/pause", views.pause, "POST"),
        ("/queues/resume", views.resume, "POST"),
        ("/list", views.job_list.page, "GET"),
        ("/list/{action}", views.job_list.confirm, "GET"),
        ("/list/{action}", views.job_list.act, "POST"),
    ]
    routes = [
        Route(path, views.guarded(endpoint), methods=[method]) for path, endpoint, method in pages
    ]
    routes.append(Route("/static/dashboard.css", _stylesheet, methods=["GET"]))
    app = Starlette(routes=routes)
    app.add_middleware(SecurityHeaders)
    return app


async def _stylesheet(request: Request) -> Response:
    return Response(STYLESHEET.read_bytes(), media_type="text/css")


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response, error pages included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
