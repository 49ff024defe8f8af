# Worker machinery: you should not need to edit this file (write handlers in handlers/).
"""The handler registry: which function runs each job kind, its payload model and timeout.

    @handler("send_webhook", timeout=30)
    async def send_webhook(payload: WebhookPayload, job: JobInfo) -> None: ...

The payload model is the annotation of the handler's first parameter; the worker validates
the job's payload with it before the handler runs (describe_validation_error() words what
does not fit). What the handler returns becomes the job's result (queue/results.py).

A kind may choose its own backoff (`@handler(kind, backoff=Backoff(base=1, cap=60))`) and a
handler the delay before its next attempt (`raise RetryAfter(30)`); without either, the
database's curve applies (`<schema>.backoff()`). A handler whose job is not ready yet runs it
again later without spending an attempt (`raise Snooze(60)`).
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import BaseModel, ValidationError

from .dependencies import NO_DEPENDENCIES, Dependencies, Kind

DEFAULT_TIMEOUT = 300.0


# What JobInfo.report_progress() calls: stores the progress, answers whether the attempt still
# owns the job.
ProgressReporter = Callable[[Any], Awaitable[bool]]


@dataclass(frozen=True)
class JobInfo:
    """What a handler may want to know about the job it runs, and how it reports progress."""

    id: int
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    # The user who submitted the job from the app (their auth.users id), for jobs a signed-in
    # user submitted with <schema>_public.client_enqueue(); None for the others.
    owner: str | None = None
    # What the jobs it depended on (enqueued with depends_on, or a Workflow's steps) ended
    # with, by id and by kind (dependencies.py); empty for a job that depended on none.
    dependencies: Dependencies = NO_DEPENDENCIES
    # Set by the worker. A test that calls a handler directly may pass its own (one that
    # records what is reported, say), or none: progress then goes nowhere.
    progress_reporter: ProgressReporter | None = field(default=None, repr=False, compare=False)

    async def report_progress(self, progress: Any) -> bool:
        """Store how far the job got (a dict, list, str, number, bool or pydantic model; up to
        64 KiB of JSON), replacing what was reported before: readable by job id while the job
        runs (the command line's `job ID`, `queue.job(id)`). One round trip per call, so
        report every second or so, not per item. Returns False when this attempt no longer
        owns the job (it was cancelled, or its lease was lost): the handler may stop. Raises
        ValueError for a value that is not JSON or too large."""
        if self.progress_reporter is None:
            return True
        return await self.progress_reporter(progress)


class PermanentError(Exception):
    """Raise this from a handler when trying again cannot help (say, the webhook URL answers
    410 Gone): the job goes to the dead letters at once instead of being retried."""


class UserFacingError(PermanentError):
    """Raise this from a handler of a kind users submit from the app to fail the job for good
    with a message its owner reads (my_jobs.error), e.g. "the export is over 1 GB". Word it
    for them: it is the only error they see (any other error shows as none)."""


class RetryAfter(Exception):
    """Raise this from a handler to fail the attempt and have the job tried again after
    `delay` (seconds, or a timedelta) instead of the kind's backoff: say, the Retry-After of
    an API that answered 429. The attempt counts: after the job's last one it goes to the
    dead letters, as after any failure. `message` is the job's last_error."""

    def __init__(self, delay: float | timedelta, message: str | None = None) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"RetryAfter needs a delay of 0 seconds or more, got {delay!r}")
        self.delay = timedelta(seconds=seconds)
        super().__init__(message or f"retry after {seconds:g}s")


class Snooze(Exception):
    """Raise this from a handler to have its job run again after `delay` (seconds, or a
    timedelta) without spending an attempt: the job is not ready yet (an export still being
    built, a payment not yet settled). Not an error: nothing is recorded but the count of the
    job's snoozes (job(id)'s `snoozes`). A job's snooze after `max_snoozes` (1 to 10,000) fails
    it for good instead, with an error that says so, so a job cannot snooze forever."""

    def __init__(self, delay: float | timedelta, max_snoozes: int = 100) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not 0 <= seconds <= 1e9:  # (NaN fails too)
            raise ValueError(
                f"Snooze needs a delay of 0 seconds or more (at most 1e9), got {delay!r}"
            )
        if not 1 <= max_snoozes <= 10_000:
            raise ValueError(f"Snooze's max_snoozes must be from 1 to 10000, got {max_snoozes}")
        self.delay = timedelta(seconds=seconds)
        self.max_snoozes = max_snoozes
        super().__init__(f"snooze for {seconds:g}s")


@dataclass(frozen=True)
class Backoff:
    """A kind's own delays between attempts: `base` seconds after the first failure, times
    `factor` after each next one, at most `cap`; `jitter` is the share of each delay drawn at
    random (0: none; 0.5, the database's own curve: a random point in the upper half), so jobs
    that failed together spread out. Backoff() is the database's curve: 5 s, 10 s, 20 s, ... up
    to an hour."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ValueError(
                f"{self}: base must be positive, factor 1 or more and cap at least base"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"{self}: jitter is a share of the delay, from 0 to 1")

    def delay(self, attempt: int) -> timedelta:
        """The pause after failed attempt number `attempt` (1 for the first)."""
        exponent = max(attempt, 1) - 1
        try:
            full = min(self.cap, self.base * self.factor**exponent)
        except OverflowError:  # a float's range ends long before an attempt count does
            full = self.cap
        return timedelta(seconds=full * (1 - self.jitter * random.random()))


# A handler returns its job's result, or None.
HandlerFunc = Callable[[Any, JobInfo], Awaitable[Any]]
F = TypeVar("F", bound=HandlerFunc)
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")
# The handler of a Kind: takes its payload model, returns its result type.
TypedHandler = Callable[[P, JobInfo], Awaitable[R]]


@dataclass(frozen=True)
class Registration:
    kind: str
    func: HandlerFunc
    payload_model: type[BaseModel]
    timeout: float
    # The kind's own delays between attempts; None: the database's backoff().
    backoff: Backoff | None = None


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Registration] = {}

    @overload
    def handler(
        self,
        kind: Kind[P, R],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> Callable[[TypedHandler[P, R]], TypedHandler[P, R]]: ...

    @overload
    def handler(
        self, kind: str, *, timeout: float = DEFAULT_TIMEOUT, backoff: Backoff | None = None
    ) -> Callable[[F], F]: ...

    def handler(
        self,
        kind: str | Kind[Any, Any],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> Callable[[Any], Any]:
        """Register an async function as the handler of `kind` (stopped after `timeout`
        seconds; its failed attempts retried after `backoff`, or the database's curve). Given a
        Kind (dependencies.py), the handler must take its payload model and return its result
        type (mypy checks it; the payload model is checked here too)."""
        name = kind.name if isinstance(kind, Kind) else kind

        def register(func: F) -> F:
            if isinstance(kind, Kind):
                _check_kind(kind, _payload_model(name, func))
            self.add(name, func, timeout=timeout, backoff=backoff)
            return func

        return register

    def add(
        self,
        kind: str,
        func: HandlerFunc,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> None:
        name = getattr(func, "__qualname__", repr(func))
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"handler {name} for {kind!r} must be `async def` (wrap blocking code in "
                "`await asyncio.to_thread(...)`)"
            )
        if kind in self._handlers and self._handlers[kind].func is not func:
            raise ValueError(f"kind {kind!r} already has a handler: {self._handlers[kind].func}")
        if timeout <= 0:
            raise ValueError(f"timeout of {kind!r} must be positive, got {timeout}")
        model = _payload_model(kind, func)
        self._handlers[kind] = Registration(kind, func, model, timeout, backoff)

    def get(self, kind: str) -> Registration | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def discover(self, package: str) -> None:
        """Import every module of `package` (e.g. "myapp.handlers"), so their decorators run."""
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            if not info.name.startswith("_"):
                importlib.import_module(f"{package}.{info.name}")


def _payload_model(kind: str, func: HandlerFunc) -> type[BaseModel]:
    parameters = list(inspect.signature(func).parameters)
    hints = get_type_hints(func)
    model = hints.get(parameters[0]) if parameters else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(
            f"handler for {kind!r}: annotate its first parameter with a pydantic model, "
            "e.g. `async def handle(payload: MyPayload, job: JobInfo) -> None`"
        )
    return model


def _check_kind(kind: Kind[Any, Any], model: type[BaseModel]) -> None:
    if model is not kind.payload:
        raise TypeError(
            f"handler for {kind.name!r}: its payload is a {model.__name__}, but {kind!r} "
            f"takes a {kind.payload.__name__}"
        )


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors on one line: `to: String should match pattern ...; text: Field
    required`."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'payload'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )


# The handlers of this application; handlers/ modules register with `@handler(...)`.
registry = Registry()
handler = registry.handler


def load_handlers() -> Registry:
    """Import every module in handlers/ and return the registry they registered with."""
    registry.discover(f"{__package__}.handlers")
    return registry
