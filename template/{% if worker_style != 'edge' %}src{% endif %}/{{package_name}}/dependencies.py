# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""What the jobs a job depends on ended with, as its handler reads them: `job.dependencies`.

A job enqueued with `depends_on` (a step of a Workflow, queue/workflow.py) runs once the jobs
it depends on are done. The queue hands it their kinds, statuses and results in its payload,
under `_dependencies`; the worker takes them out before the handler's model validates the
payload, and gives them to the handler by id and by kind:

    @handler("zip_thumbnails")
    async def zip_thumbnails(payload: Zip, job: JobInfo) -> str:
        paths = [thumb.path for thumb in job.dependencies.results(THUMBNAIL)]
        ...

A `Kind` names a job kind with its payload and result types, so that the code that enqueues
a step and the handler that reads its result agree on them (THUMBNAIL above).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter

# Where the queue puts the dependencies in a dependent's payload (and refuses them at enqueue).
DEPENDENCIES_KEY = "_dependencies"

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")


class Kind(Generic[P, R]):
    """A job kind, its payload model and its result type (a pydantic model, a TypedDict, or
    any type pydantic validates, e.g. `list[str]`):

        THUMBNAIL = Kind("thumbnail", Resize, Thumbnail)

    A Workflow's step of this kind takes a `Resize` payload, and a dependent's handler reads
    its result as a `Thumbnail` (`job.dependencies.results(THUMBNAIL)`)."""

    def __init__(self, name: str, payload: type[P], result: type[R]) -> None:
        self.name = name
        self.payload = payload
        self.result = result

    @cached_property
    def _results(self) -> TypeAdapter[R]:
        return TypeAdapter(self.result)

    def parse_result(self, value: Any) -> R:
        """A result of this kind as stored (JSON), as its type (pydantic's ValidationError
        when it does not fit)."""
        return self._results.validate_python(value)

    def __repr__(self) -> str:
        return f"Kind({self.name!r}, {self.payload.__name__}, {self.result!r})"


@dataclass(frozen=True, slots=True)
class Dependency:
    """One job this job depended on: its kind, how it ended ('done', or 'failed' or
    'cancelled' for a job enqueued with on_dependency_failure 'run'), its result (JSON, None
    when it returned none) and, when it did not succeed, its error."""

    id: int
    kind: str
    status: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"


@dataclass(frozen=True)
class Dependencies(Mapping[int, Dependency]):
    """The jobs a job depended on, by id (`job.dependencies[12]`), in id order when iterated;
    by kind with of_kind() and by_kind; their results as their Kind's type with results()
    and result(). Empty for a job enqueued without dependencies."""

    _by_id: Mapping[int, Dependency] = field(default_factory=dict)
    # The queue left the results out of the payload (they would have made it too large); the
    # worker fetched them with dependency_results() before the handler ran.
    results_omitted: bool = False

    def __getitem__(self, job_id: int) -> Dependency:
        return self._by_id[job_id]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._by_id))

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def by_kind(self) -> dict[str, list[Dependency]]:
        """The dependencies of each kind, in id order."""
        kinds: dict[str, list[Dependency]] = {}
        for job_id in self:
            kinds.setdefault(self[job_id].kind, []).append(self[job_id])
        return kinds

    def of_kind(self, kind: str | Kind[Any, Any]) -> list[Dependency]:
        """The dependencies of `kind` (a name or a Kind), in id order; [] when none."""
        name = kind.name if isinstance(kind, Kind) else kind
        return self.by_kind.get(name, [])

    @property
    def failed(self) -> list[Dependency]:
        """Those that did not succeed (only a job enqueued with 'run' sees any)."""
        return [self[job_id] for job_id in self if not self[job_id].ok]

    def results(self, kind: Kind[Any, R]) -> list[R]:
        """The results of the done dependencies of `kind`, in id order, as its result type."""
        return [kind.parse_result(d.result) for d in self.of_kind(kind) if d.ok]

    def result(self, kind: Kind[Any, R]) -> R:
        """The result of the one done dependency of `kind`; LookupError when there is none or
        more than one (use results())."""
        found = self.results(kind)
        if len(found) != 1:
            raise LookupError(
                f"{len(found)} done dependencies of kind {kind.name!r}, not one "
                f"(the job depends on: {self._described()}): use results() for a list"
            )
        return found[0]

    def _described(self) -> str:
        return ", ".join(f"#{d.id} {d.kind} {d.status}" for d in self.values()) or "nothing"

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], results_omitted: bool = False) -> Dependencies:
        """The rows of `dependency_results(job_id)`: id, kind, status, result, error."""
        found = [_dependency(row["id"], row) for row in rows]
        return cls({dependency.id: dependency for dependency in found}, results_omitted)


NO_DEPENDENCIES = Dependencies()


def take_dependencies(payload: Any) -> tuple[Any, Dependencies]:
    """The payload without `_dependencies`, and the dependencies it held (NO_DEPENDENCIES for a
    payload without them). ValueError when they are not in the queue's shape: an object keyed
    by job id of {kind, status, result, error}; where the queue left the results out, its
    entries say "results_omitted": true."""
    if not isinstance(payload, dict) or DEPENDENCIES_KEY not in payload:
        return payload, NO_DEPENDENCIES
    rest = {key: value for key, value in payload.items() if key != DEPENDENCIES_KEY}
    given = payload[DEPENDENCIES_KEY]
    if not isinstance(given, dict):
        raise ValueError(f"{DEPENDENCIES_KEY} must be an object keyed by job id, got {given!r}")
    entries = {key: value for key, value in given.items() if key != "results_omitted"}
    found = [_dependency(key, value) for key, value in entries.items()]
    omitted = given.get("results_omitted") is True or any(
        isinstance(entry, dict) and entry.get("results_omitted") is True
        for entry in entries.values()
    )
    return rest, Dependencies({dependency.id: dependency for dependency in found}, omitted)


def _dependency(key: Any, entry: Any) -> Dependency:
    try:
        job_id = int(key)
        return Dependency(
            job_id,
            str(entry["kind"]),
            str(entry["status"]),
            entry.get("result"),
            entry.get("error"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"{DEPENDENCIES_KEY}[{key!r}] is not a job id with its kind and status: {entry!r}"
        ) from exc
