# Dashboard machinery: you should not need to edit this file.
"""The dashboard's pages and actions.

GET only reads; every change (retry, cancel, pause, resume, log out, and the job list's bulk
actions, job_list.py) is a POST that carries its CSRF token and comes from this site
(auth.py). Pages are rendered on the server by the Jinja templates in templates/, with
autoescaping: payloads and errors are user data.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .auth import COOKIE, SESSION_SECONDS, Guard, LoginThrottle, from_another_site
from .chart import throughput_chart
from .forms import Refusal, read_form
from .job_list import JobList
from .source import QueueSource, Row
from .workflow import brief, draw

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
# The largest job id there can be (ids are bigint).
MAX_JOB_ID = 2**63 - 1
# How many dead letters and retrying jobs the overview lists.
LIST_LIMIT = 50
THROUGHPUT_MINUTES = 30
# What a redirect after an action may ask the next page to say (never text from the URL).
NOTICES = {
    "retried": "Queued again.",
    "cancelled": "Cancelled.",
    "paused": "Queue paused: running jobs finish, no more are claimed.",
    "resumed": "Queue resumed.",
}

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class QueueSummary:
    """One queue's line on the overview, summed over its kinds from the `stats` view."""

    queue: str
    paused: bool = False
    paused_at: datetime | None = None
    queued: int = 0
    runnable: int = 0
    running: int = 0
    oldest_runnable: float | None = None  # seconds
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    kinds: set[str] = field(default_factory=set)


class Views:
    def __init__(self, source: QueueSource, guard: Guard, title: str, login_delay: float) -> None:
        self._source = source
        self._guard = guard
        self._title = title
        self._login_delay = login_delay
        # Passwords are checked one at a time, a wrong one holding up the next check.
        self._throttle = LoginThrottle(login_delay)
        self._jinja = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._jinja.filters.update(when=when, duration=duration, as_json=as_json, brief=brief)
        self.job_list = JobList(source, self._render, self._session, self._check_post)

    # --- pages

    async def login_page(self, request: Request) -> Response:
        if self._guard.session(request.cookies.get(COOKIE)):
            return RedirectResponse("/", status_code=303)
        return self._render("login.html", None)

    async def login(self, request: Request) -> Response:
        if from_another_site(request):
            raise Refusal(403, "This form must be sent from the dashboard's own page.")
        form = await read_form(request)
        attempt = form.get("password", "")
        right = await self._throttle.check(lambda: self._guard.password_matches(attempt))
        if right is None:
            log.warning(
                "dashboard: login attempt turned away, too many waiting",
                extra={"event": "dashboard.login_turned_away"},
            )
            raise Refusal(429, "Too many login attempts at once: try again in a moment.")
        if not right:
            log.warning("dashboard: wrong password", extra={"event": "dashboard.login_refused"})
            await asyncio.sleep(self._login_delay)
            return self._render("login.html", None, status=401, wrong=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            self._guard.open_session(),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        sid = self._check_post(request, await read_form(request))
        self._guard.close_session(sid)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict")
        return response

    async def overview(self, request: Request) -> Response:
        sid = self._session(request)
        if sid is None:
            return RedirectResponse("/login", status_code=303)
        stats, states, dead, retrying, throughput, unclaimed = await asyncio.gather(
            self._source.stats(),
            self._source.queue_states(),
            self._source.dead_letters(LIST_LIMIT),
            self._source.retrying(LIST_LIMIT),
            self._source.throughput(THROUGHPUT_MINUTES),
            self._source.unclaimed(),
        )
        return self._render(
            "overview.html",
            sid,
            queues=summarize(stats, states),
            kinds=sorted(stats, key=lambda r: (r["queue"], r["kind"], r["status"])),
            unclaimed={(row["queue"], row["kind"]) for row in unclaimed},
            dead_letters=dead,
            retrying=retrying,
            chart=throughput_chart(throughput),
            minutes=THROUGHPUT_MINUTES,
            limit=LIST_LIMIT,
            notice=NOTICES.get(request.query_params.get("done", "")),
        )

    async def find_job(self, request: Request) -> Response:
        """The "find a job" form: GET /jobs?id=N goes to /jobs/N."""
        if self._session(request) is None:
            return RedirectResponse("/login", status_code=303)
        job_id = _job_id(request.query_params.get("id", ""))
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    async def job(self, request: Request) -> Response:
        sid = self._session(request)
        if sid is None:
            return RedirectResponse("/login", status_code=303)
        job_id = _job_id(request.path_params["job_id"])
        job = await self._source.job(job_id)
        if job is None:
            raise Refusal(
                404, f"No job {job_id}: no such job, or it was pruned after the retention."
            )
        notice = NOTICES.get(request.query_params.get("done", ""))
        workflow = None
        if job.workflow_id is not None:
            steps = await self._source.workflow(job.workflow_id)
            workflow = draw(job.workflow_id, steps, job.id)
        return self._render("job.html", sid, job=job, workflow=workflow, notice=notice)

    # --- actions

    async def retry(self, request: Request) -> Response:
        self._check_post(request, await read_form(request))
        job_id = _job_id(request.path_params["job_id"])
        if not await self._source.retry(job_id):
            raise Refusal(
                409, f"Job {job_id} was not retried: only dead letters and cancelled jobs can be."
            )
        log.info("dashboard: retry", extra={"event": "dashboard.retry", "job_id": job_id})
        return RedirectResponse(f"/jobs/{job_id}?done=retried", status_code=303)

    async def cancel(self, request: Request) -> Response:
        self._check_post(request, await read_form(request))
        job_id = _job_id(request.path_params["job_id"])
        if not await self._source.cancel(job_id):
            raise Refusal(409, f"Job {job_id} was not cancelled: it has finished.")
        log.info("dashboard: cancel", extra={"event": "dashboard.cancel", "job_id": job_id})
        return RedirectResponse(f"/jobs/{job_id}?done=cancelled", status_code=303)

    async def pause(self, request: Request) -> Response:
        form = await read_form(request)
        self._check_post(request, form)
        queue = _queue_name(form)
        await self._source.pause(queue)
        log.info("dashboard: pause", extra={"event": "dashboard.pause", "queue": queue})
        return RedirectResponse("/?done=paused", status_code=303)

    async def resume(self, request: Request) -> Response:
        form = await read_form(request)
        self._check_post(request, form)
        queue = _queue_name(form)
        await self._source.resume(queue)
        log.info("dashboard: resume", extra={"event": "dashboard.resume", "queue": queue})
        return RedirectResponse("/?done=resumed", status_code=303)

    # --- the plumbing every page and action shares

    def guarded(self, endpoint: Endpoint) -> Endpoint:
        """The endpoint, with refusals and queue errors answered as pages of their own."""

        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Refusal as refusal:
                return self._message(request, refusal.status, refusal.message)
            except Exception:
                # The details (which may name hosts or users) go to the log, not the page.
                log.exception("dashboard: the queue did not answer")
                return self._message(
                    request, 503, "The queue did not answer: see the dashboard's log."
                )

        return run

    def _session(self, request: Request) -> str | None:
        return self._guard.session(request.cookies.get(COOKIE))

    def _check_post(self, request: Request, form: Mapping[str, str]) -> str:
        """The session of a POST that may change something: signed in, from this site, with
        the token of this form."""
        sid = self._session(request)
        if sid is None:
            raise Refusal(403, "Your session has ended: log in again.")
        if from_another_site(request) or not self._guard.csrf_ok(
            sid, request.url.path, form.get("csrf")
        ):
            raise Refusal(403, "This form must be sent from the dashboard's own page.")
        return sid

    def _render(
        self, name: str, sid: str | None, status: int = 200, **context: Any
    ) -> HTMLResponse:
        def csrf(action: str) -> str:
            assert sid is not None, "forms that change something are for signed-in pages only"
            return self._guard.csrf_token(sid, action)

        page = self._jinja.get_template(name).render(
            {
                "title": self._title,
                "signed_in": sid is not None,
                "csrf": csrf,
                "now": datetime.now(UTC),
                "notice": None,
                "wrong": False,
                **context,
            }
        )
        return HTMLResponse(page, status_code=status)

    def _message(self, request: Request, status: int, message: str) -> HTMLResponse:
        sid = self._session(request)
        return self._render("message.html", sid, status=status, message=message)


def summarize(stats: Sequence[Row], states: Sequence[Any]) -> list[QueueSummary]:
    """Each queue's line: `stats` rows summed over kinds, the pause from `queue_states`."""
    queues: dict[str, QueueSummary] = {}
    for row in stats:
        summary = queues.setdefault(row["queue"], QueueSummary(row["queue"]))
        summary.kinds.add(row["kind"])
        jobs = int(row["jobs"])
        if row["status"] == "queued":
            summary.queued += jobs
            summary.runnable += int(row["runnable"])
        elif row["status"] == "running":
            summary.running += jobs
        elif row["status"] == "done":
            summary.done += jobs
        elif row["status"] == "failed":
            summary.failed += jobs
        elif row["status"] == "cancelled":
            summary.cancelled += jobs
        age = seconds(row["oldest_runnable_age"])
        if age is not None and (summary.oldest_runnable is None or age > summary.oldest_runnable):
            summary.oldest_runnable = age
    for state in states:
        summary = queues.setdefault(state.queue, QueueSummary(state.queue))
        summary.paused = state.paused
        summary.paused_at = state.paused_at
    return sorted(queues.values(), key=lambda q: q.queue)


def _job_id(text: str) -> int:
    text = text.strip().lstrip("#")
    # ASCII digits only: int() takes the digits of every script (and "²" is a digit to
    # isdigit(), yet no number to int()).
    if not (text.isascii() and text.isdigit()):
        raise Refusal(400, "A job id is a whole number, e.g. 42.")
    job_id = int(text)
    if job_id > MAX_JOB_ID:
        raise Refusal(404, f"No job {job_id}: job ids go up to {MAX_JOB_ID}.")
    return job_id


def _queue_name(form: Mapping[str, str]) -> str:
    queue = form.get("queue", "")
    if not queue:
        raise Refusal(400, "Which queue? The form named none.")
    return queue


# --- how values are shown (Jinja filters)

# An interval as PostgREST sends it (Postgres' own text form), e.g. "1 day 02:03:04.5".
_INTERVAL = re.compile(
    r"^(?:(?P<years>-?\d+) years? ?)?(?:(?P<months>-?\d+) mons? ?)?(?:(?P<days>-?\d+) days? ?)?"
    r"(?:(?P<sign>-)?(?P<hours>\d+):(?P<minutes>\d+):(?P<seconds>\d+(?:\.\d+)?))?$"
)


def seconds(value: Any) -> float | None:
    """An interval in seconds: a timedelta (psycopg), a number, or Postgres' interval text
    (the Data API); None stays None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        return float(value)
    match = _INTERVAL.match(str(value).strip())
    if match is None or not str(value).strip():
        raise ValueError(f"not an interval: {value!r}")
    parts = {name: float(v) for name, v in match.groupdict().items() if v and name != "sign"}
    clock = parts.get("hours", 0) * 3600 + parts.get("minutes", 0) * 60 + parts.get("seconds", 0)
    if match["sign"]:
        clock = -clock
    days = parts.get("years", 0) * 365.25 + parts.get("months", 0) * 30 + parts.get("days", 0)
    return days * 86400 + clock


def duration(value: float | None) -> str:
    """Seconds as a person reads them: 4 s, 3 min 5 s, 2 h 3 min, 3 d 4 h."""
    if value is None:
        return "-"
    total = int(value)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def when(value: Any) -> str:
    """A timestamp (a datetime, or ISO text from the Data API) in UTC, to the second."""
    if value is None:
        return "-"
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def as_json(value: Any) -> str:
    """A payload, progress or result, indented."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)
