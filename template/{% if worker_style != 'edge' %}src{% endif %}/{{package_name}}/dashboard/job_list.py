# Dashboard machinery: you should not need to edit this file.
"""The job list: the jobs of a status filtered by kind, queue, time, idempotency key and
workflow, a page at a time (keyset pages: each starts after the last row of the one before),
and the bulk actions on the filtered set, retry and cancel, each after a page that says how
many jobs it will change and asks to confirm.

Every figure comes from the queue's SQL (list_jobs(), count_jobs(), retry_jobs(),
cancel_jobs()): a page reads only its own rows, a count stops at COUNT_CAP, and a bulk action
runs as calls of BULK_SHARE jobs, each its own short transaction. A bulk action's form carries
the filters it was counted with and the time it was counted at (`until`): jobs that come into
the set afterwards are not changed, and none is changed twice. A workflow filter narrows a
bulk action as any other filter does; the queue's SQL cascades as it does for one job: a
cancelled job cancels what waits on it, and a retried one brings back what its failure
cancelled, waiting again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .forms import Refusal, read_form
from .source import QueueSource, Row

# The statuses, as the list's tabs name them.
STATUSES = {
    "waiting": "Waiting",
    "queued": "Queued",
    "running": "Running",
    "done": "Done",
    "failed": "Dead letters",
    "cancelled": "Cancelled",
}
FINISHED = ("done", "failed", "cancelled")
PAGE_SIZE = 50
# A count stops here ("more than 10,000"), and a bulk action changes at most this many jobs.
COUNT_CAP = 10_000
# Jobs a bulk action's call changes (one short transaction each).
BULK_SHARE = 500
# Which bulk action each status offers, and what it is called.
ACTIONS = {"retry": ("failed", "cancelled"), "cancel": ("queued", "waiting")}
REFUSED_ACTIONS = {
    "retry": "Only dead letters and cancelled jobs can be retried: list one of those statuses.",
    "cancel": "Only queued and waiting jobs can be cancelled here: list one of those statuses "
    "(a running job is cancelled from its own page).",
}
# The longest kind, queue or key a filter takes (the queue's own limit on kinds and queues).
MAX_TEXT = 200

Render = Callable[..., HTMLResponse]


@dataclass(frozen=True)
class JobFilter:
    """The filters of the list, as list_jobs() takes them (None: not filtered)."""

    status: str | None = "failed"
    kind: str | None = None
    queue: str | None = None
    idempotency_key: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    workflow: int | None = None  # the id of any of its jobs

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> JobFilter:
        """The filters of a query string or a form; a blank field filters nothing."""
        texts = {name: _text(fields, name) for name in ("status", "kind", "queue", "key")}
        status = texts["status"]
        if status is None and texts["key"] is None:
            status = "failed"  # the dead letters: what the list opens on
        if status is not None and status not in STATUSES:
            raise Refusal(400, f"No status {status!r}: choose one of {', '.join(STATUSES)}.")
        return cls(
            status,
            texts["kind"],
            texts["queue"],
            texts["key"],
            _moment(fields, "since"),
            _moment(fields, "until"),
            _workflow(fields),
        )

    def fields(self) -> dict[str, str]:
        """The filters as form fields (and a query string), blank ones left out."""
        named = {"key" if k == "idempotency_key" else k: v for k, v in asdict(self).items()}
        return {
            name: value.isoformat() if isinstance(value, datetime) else str(value)
            for name, value in named.items()
            if value is not None
        }

    def query(self, **more: str) -> str:
        return urlencode(self.fields() | more)


class JobList:
    """The list's page, a bulk action's confirmation, and the bulk action itself. It renders
    and checks requests as the other pages do (the callables Views hands it)."""

    def __init__(
        self,
        source: QueueSource,
        render: Render,
        session: Callable[[Request], str | None],
        check_post: Callable[[Request, Mapping[str, str]], str],
    ) -> None:
        self._source = source
        self._render = render
        self._session = session
        self._check_post = check_post

    async def page(self, request: Request) -> Response:
        sid = self._session(request)
        if sid is None:
            return RedirectResponse("/login", status_code=303)
        chosen = JobFilter.parse(request.query_params)
        after = _cursor(request.query_params.get("after", ""), chosen.status)
        found = await self._source.list_jobs(
            **asdict(chosen),
            before_id=after[0],
            before_finished_at=after[1],
            page_size=PAGE_SIZE + 1,
        )
        total = await self._source.count_jobs(**asdict(chosen), cap=COUNT_CAP)
        more = len(found) > PAGE_SIZE
        rows = list(found[:PAGE_SIZE])
        next_page = chosen.query(after=_cursor_of(rows[-1], chosen.status)) if more else None
        return self._render(
            "jobs.html",
            sid,
            chosen=chosen,
            inputs=_inputs(chosen),
            rows=rows,
            total=total,
            cap=COUNT_CAP,
            next_page=next_page,
            first_page=chosen.query() if after != (None, None) else None,
            statuses=STATUSES,
            action=next((a for a, among in ACTIONS.items() if chosen.status in among), None),
        )

    async def confirm(self, request: Request) -> Response:
        """GET /list/{action}?filters: how many jobs the action would change, and the
        form that does it, with the filters and the time they were counted at."""
        sid = self._session(request)
        if sid is None:
            return RedirectResponse("/login", status_code=303)
        action = _action(request)
        chosen = _for_action(JobFilter.parse(request.query_params), action)
        now = datetime.now(UTC)
        chosen = replace(chosen, until=min(chosen.until or now, now))
        total = await self._source.count_jobs(**asdict(chosen), cap=COUNT_CAP)
        return self._render(
            "bulk.html",
            sid,
            action=action,
            chosen=chosen,
            total=total,
            changed=min(total, COUNT_CAP),
            cap=COUNT_CAP,
            done=None,
        )

    async def act(self, request: Request) -> Response:
        """POST /list/{action}: the action on at most the count the form confirmed, in
        calls of BULK_SHARE jobs."""
        form = await read_form(request)
        sid = self._check_post(request, form)
        action = _action(request)
        chosen = _for_action(JobFilter.parse(form), action)
        if chosen.until is None:
            raise Refusal(400, "This form names no time it was counted at: open it again.")
        wanted = _count(form.get("count", ""))
        call = self._source.retry_jobs if action == "retry" else self._source.cancel_jobs
        changed = 0
        while changed < wanted:
            share = await call(**asdict(chosen), max_jobs=min(BULK_SHARE, wanted - changed))
            if share == 0:
                break
            changed += share
        return self._render(
            "bulk.html", sid, action=action, chosen=chosen, total=wanted, done=changed
        )


def _inputs(chosen: JobFilter) -> dict[str, str]:
    """The filter form's values: the time filters as its date-time fields show them (UTC)."""
    fields = chosen.fields()
    for name in ("since", "until"):
        moment = getattr(chosen, name)
        if moment is not None:
            fields[name] = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return fields


def _text(fields: Mapping[str, str], name: str) -> str | None:
    value = fields.get(name, "").strip()
    if len(value) > MAX_TEXT:
        raise Refusal(400, f"The {name} filter is too long: at most {MAX_TEXT} characters.")
    return value or None


def _moment(fields: Mapping[str, str], name: str) -> datetime | None:
    """A time filter: ISO 8601, as the browser's date-time field sends it; UTC unless it says
    otherwise."""
    value = fields.get(name, "").strip()
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise Refusal(400, f"The {name} filter is no time: give one as 2026-12-07T14:30.") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _cursor(text: str, status: str | None) -> tuple[int | None, datetime | None]:
    """The row a page starts after, from the `after` its link carries: `<id>`, or for finished
    jobs `<finished_at>_<id>`."""
    if not text:
        return None, None
    at, _, job_id = text.rpartition("_")
    refused = Refusal(400, "That page link is not one the list made: start from the first page.")
    if not (job_id.isascii() and job_id.isdigit()) or (status in FINISHED) != bool(at):
        raise refused
    try:
        return int(job_id), datetime.fromisoformat(at) if at else None
    except ValueError:
        raise refused from None


def _cursor_of(row: Row, status: str | None) -> str:
    if status not in FINISHED:
        return str(row["id"])
    finished = row["finished_at"]
    moment = finished if isinstance(finished, datetime) else datetime.fromisoformat(finished)
    return f"{moment.isoformat()}_{row['id']}"


def _action(request: Request) -> str:
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise Refusal(404, f"No bulk action {action!r}: there are retry and cancel.")
    return str(action)


def _for_action(chosen: JobFilter, action: str) -> JobFilter:
    if chosen.status not in ACTIONS[action]:
        raise Refusal(409, REFUSED_ACTIONS[action])
    return chosen


def _workflow(fields: Mapping[str, str]) -> int | None:
    """The workflow filter: the id of any of its jobs (its pages link with its first job's)."""
    text = fields.get("workflow", "").strip().lstrip("#")
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > 2**63 - 1:
        raise Refusal(400, "The workflow filter is the id of one of its jobs, e.g. 42.")
    return int(text)


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= COUNT_CAP:
        raise Refusal(400, f"This form's count is not a number of jobs up to {COUNT_CAP}.")
    return int(text)
