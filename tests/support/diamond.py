"""A diamond workflow (A -> B, A -> C, B and C -> D) enqueued and moved along through the
queue's SQL, as a worker would: for the tests of what the CLI and the dashboard show of it."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

# Each step's kind (one kind each, so that a claim of a kind takes that step).
KINDS = {"a": "fetch_album", "b": "resize_small", "c": "resize_large", "d": "zip_album"}
# What A and B return; the error C is dead-lettered with (markup, shown as text).
RESULTS = {"a": {"photos": ["beach.jpg"]}, "b": {"path": "beach@64w.jpg"}}
C_ERROR = "ValueError: <b>beach.jpg</b> is too large"


@dataclass(frozen=True)
class Diamond:
    a: int
    b: int
    c: int
    d: int


def enqueue_diamond(db: psycopg.Connection) -> Diamond:
    """The four steps in one enqueue_many() call (D waits for B and C, which wait for A), then
    A claimed and done with its result: B and C are queued, D is waiting."""
    steps = [
        {"kind": KINDS["a"], "payload": {"album": "summer"}},
        {"kind": KINDS["b"], "payload": {"width": 64}, "depends_on_index": [0]},
        {"kind": KINDS["c"], "payload": {"width": 4096}, "depends_on_index": [0]},
        {"kind": KINDS["d"], "payload": {}, "depends_on_index": [1, 2]},
    ]
    rows = db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(steps),)).fetchall()
    diamond = Diamond(*(job_id for (job_id,) in rows))
    complete(db, "a", RESULTS["a"])
    return diamond


def complete(db: psycopg.Connection, step: str, result: dict) -> None:
    """Claim the step's job (by its kind) and complete it with `result`."""
    job_id, token = _claim(db, step)
    db.execute("select pgqueue.complete(%s, %s, %s)", (job_id, token, Jsonb(result)))


def finish_diamond(db: psycopg.Connection) -> None:
    """B done with its result, C dead-lettered: D is cancelled, its dependency failed."""
    complete(db, "b", RESULTS["b"])
    job_id, token = _claim(db, "c")
    db.execute("select pgqueue.fail(%s, %s, %s, retryable => false)", (job_id, token, C_ERROR))


def _claim(db: psycopg.Connection, step: str) -> tuple[int, str]:
    row = db.execute(
        "select id, lock_token from pgqueue.claim('w', 1, kinds => array[%s])", (KINDS[step],)
    ).fetchone()
    assert row is not None, f"step {step} ({KINDS[step]}) was not claimable"
    return row
