# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""A workflow: steps (jobs) that each run once the steps they depend on are done, enqueued
together in one enqueue_many() call, so in one transaction: all of them, or none.

    workflow = Workflow()
    photo = workflow.step(FETCH, Fetch(url=url))
    small = workflow.step(RESIZE, Resize(width=64), after=[photo])
    large = workflow.step(RESIZE, Resize(width=1024), after=[photo])
    album = workflow.step(ALBUM, Album(name="summer"), after=[small, large])
    await workflow.enqueue(queue)
    print(album.id)

Each step's handler reads what its dependencies returned in `job.dependencies` (the worker
takes them from its payload: see dependencies.py). A step may also depend on a job enqueued
before, by its id (`after=[42]`). A dependency dead-lettered or cancelled cancels the steps
that wait on it, transitively, unless a step says `on_dependency_failure="run"`.

Within your own transaction, on a direct connection, enqueue the same list of jobs and tell
the workflow the ids the database returned:

    rows = conn.execute("select * from <schema>.enqueue_many(%s)", (Jsonb(workflow.jobs()),))
    workflow.enqueued([row[0] for row in rows])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel

from ..dependencies import DEPENDENCIES_KEY, Kind
from .types import NewJob, OnDependencyFailure

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")


class Enqueuer(Protocol):
    """What enqueues a workflow: the queue client (QueueClient), or a test's stand-in."""

    async def enqueue_many(self, jobs: list[NewJob]) -> list[int]: ...


class Step(Generic[R]):
    """A step of a Workflow: its place in it, its kind, and once enqueued its job's id. `R` is
    its result's type, which its dependents read (`job.dependencies.results(kind)`)."""

    def __init__(self, workflow: Workflow, index: int, kind: str) -> None:
        self.workflow = workflow
        self.index = index
        self.kind = kind
        self._id: int | None = None

    @property
    def id(self) -> int:
        """The step's job id; LookupError before its workflow is enqueued."""
        if self._id is None:
            raise LookupError(f"{self} has no job id yet: enqueue its workflow first")
        return self._id

    def __repr__(self) -> str:
        shown = "not enqueued" if self._id is None else f"job {self._id}"
        return f"<step {self.index} ({self.kind}), {shown}>"


class Workflow:
    """Steps and what each waits for, enqueued in one call; `queue`, `priority` and
    `max_attempts` are each step's unless the step gives its own."""

    def __init__(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self._defaults = {"queue": queue, "priority": priority, "max_attempts": max_attempts}
        self._jobs: list[NewJob] = []
        self.steps: list[Step[Any]] = []

    @overload
    def step(
        self,
        kind: Kind[P, R],
        payload: P,
        *,
        after: Sequence[Step[Any] | int] = (),
        on_dependency_failure: OnDependencyFailure = "cancel",
        **options: Any,
    ) -> Step[R]: ...

    @overload
    def step(
        self,
        kind: str,
        payload: Mapping[str, Any] | BaseModel | None = None,
        *,
        after: Sequence[Step[Any] | int] = (),
        on_dependency_failure: OnDependencyFailure = "cancel",
        **options: Any,
    ) -> Step[Any]: ...

    def step(
        self,
        kind: Kind[Any, Any] | str,
        payload: Mapping[str, Any] | BaseModel | None = None,
        *,
        after: Sequence[Step[Any] | int] = (),
        on_dependency_failure: OnDependencyFailure = "cancel",
        **options: Any,
    ) -> Step[Any]:
        """Add a step: a job of `kind` (a Kind, whose payload model `payload` must be, or a
        kind's name) that runs once the steps (and job ids) `after` are done. `options` are
        NewJob's: queue, priority, max_attempts, run_after, concurrency_key,
        idempotency_key, traceparent."""
        name = kind.name if isinstance(kind, Kind) else kind
        if isinstance(kind, Kind) and not isinstance(payload, kind.payload):
            raise TypeError(
                f"a step of {name!r} takes a {kind.payload.__name__} payload, "
                f"got {type(payload).__name__}"
            )
        body = _payload(name, payload)
        indexes, ids = self._dependencies(name, after)
        job = NewJob(
            kind=name,
            payload=body,
            depends_on=ids or None,
            depends_on_index=indexes or None,
            on_dependency_failure=None if on_dependency_failure == "cancel" else "run",
            **{**{k: v for k, v in self._defaults.items() if v is not None}, **options},
        )
        self._jobs.append(job)
        step: Step[Any] = Step(self, len(self.steps), name)
        self.steps.append(step)
        return step

    def _dependencies(
        self, kind: str, after: Sequence[Step[Any] | int]
    ) -> tuple[list[int], list[int]]:
        """`after` as enqueue_many() takes it: indexes of this workflow's steps, and ids of
        jobs enqueued before (a step of a workflow enqueued before counts as its job id)."""
        indexes: list[int] = []
        ids: list[int] = []
        for dependency in after:
            if isinstance(dependency, Step) and dependency.workflow is self:
                indexes.append(dependency.index)
            elif isinstance(dependency, Step):
                if dependency._id is None:
                    raise ValueError(
                        f"a step of {kind!r} depends on {dependency}, of another workflow "
                        "that is not enqueued yet: enqueue that workflow first"
                    )
                ids.append(dependency._id)
            elif isinstance(dependency, int) and not isinstance(dependency, bool):
                ids.append(dependency)
            else:
                raise TypeError(
                    f"a step of {kind!r} may depend on steps and job ids, not {dependency!r}"
                )
        return indexes, ids

    def new_jobs(self) -> list[NewJob]:
        """The steps as enqueue_many() takes them, in order."""
        return list(self._jobs)

    def jobs(self) -> list[dict[str, Any]]:
        """The steps as the JSON array enqueue_many() takes, for your own transaction."""
        return [job.model_dump(mode="json", exclude_none=True) for job in self._jobs]

    async def enqueue(self, queue: Enqueuer) -> list[int]:
        """Enqueue every step in one enqueue_many() call (one transaction); their job ids, in
        step order (each step's `id` too)."""
        self._check_enqueueable()
        return self.enqueued(await queue.enqueue_many(self._jobs))

    def enqueued(self, ids: Sequence[int]) -> list[int]:
        """Tell the workflow the job ids enqueue_many() returned for jobs() (in order), when
        you enqueued it yourself; the ids, as a list."""
        self._check_enqueueable()
        if len(ids) != len(self.steps):
            raise ValueError(f"{len(ids)} job ids for a workflow of {len(self.steps)} steps")
        for step, job_id in zip(self.steps, ids, strict=True):
            step._id = int(job_id)
        return [int(job_id) for job_id in ids]

    def _check_enqueueable(self) -> None:
        if not self.steps:
            raise ValueError("the workflow has no steps: add them with step() first")
        if self.steps[0]._id is not None:
            raise ValueError("the workflow is enqueued already: build a new one to run it again")


def _payload(kind: str, payload: Mapping[str, Any] | BaseModel | None) -> dict[str, Any]:
    body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    if body is None:
        return {}
    if DEPENDENCIES_KEY in body:
        raise ValueError(
            f"the payload of a step of {kind!r} has a {DEPENDENCIES_KEY!r} key: the queue sets "
            "it (to its dependencies' results), so rename yours"
        )
    return dict(body)
