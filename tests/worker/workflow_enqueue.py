"""Run by tests/worker/test_worker_workflows.py with a rendered project's interpreter and
src/ (its e2e_step handler added): builds one of the tests' workflows with the project's
Workflow and enqueues it through the project's queue client (its transport), printing
{step name: job id} as JSON. Arguments: the shape, the runs' log, and (failure) the file
whose absence fails the first step, or "in-transaction" to enqueue it with psycopg in a
transaction of its own."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from my_app.handlers.e2e_workflow import STEP, Step  # type: ignore[import-not-found]
from my_app.queue import Workflow, open_queue  # type: ignore[import-not-found]
from my_app.settings import Settings  # type: ignore[import-not-found]


def build(shape: str, log: str, marker: str | None) -> tuple[Any, dict[str, Any]]:
    workflow = Workflow()

    def step(name: str, after: list[Any] | None = None, **options: Any) -> Any:
        fail_unless = options.pop("fail_unless", None)
        pad = options.pop("pad", 0)
        payload = Step(log=log, name=name, fail_unless=fail_unless, pad=pad)
        return workflow.step(STEP, payload, after=after or [], **options)

    steps: dict[str, Any] = {}
    if shape == "diamond":
        steps["A"] = step("A")
        steps["B"] = step("B", [steps["A"]])
        steps["C"] = step("C", [steps["A"]])
        steps["D"] = step("D", [steps["B"], steps["C"]])
    elif shape == "chain":
        for n in range(10):
            steps[f"s{n}"] = step(f"s{n}", [steps[f"s{n - 1}"]] if n else [])
    elif shape == "fanin":
        # results of 2 kB each: 2 MB in all, over the payload limit, so the fan-in's results
        # are left out of its payload and its worker fetches them
        children = [step(f"c{n}", pad=2000) for n in range(1000)]
        steps.update({f"c{n}": child for n, child in enumerate(children)})
        steps["zip"] = step("zip", children)
    elif shape == "failure":
        steps["A"] = step("A", fail_unless=marker)
        steps["B"] = step("B", [steps["A"]])
        steps["C"] = step("C", [steps["B"]])
        steps["R"] = step("R", [steps["A"]], on_dependency_failure="run")
    else:
        raise SystemExit(f"unknown shape {shape!r}")
    return workflow, steps


def in_transaction(workflow: Any) -> None:
    """The generated README's way: workflow.jobs() to enqueue_many() in the app's own
    transaction (psycopg, a direct connection), then the ids it returned to the workflow."""
    import psycopg
    from psycopg.types.json import Jsonb

    with psycopg.connect(os.environ["DB_URL"]) as conn, conn.transaction():
        rows = conn.execute("select * from pgqueue.enqueue_many(%s)", (Jsonb(workflow.jobs()),))
        workflow.enqueued([row[0] for row in rows])


async def main() -> None:
    shape, log = sys.argv[1], sys.argv[2]
    extra = sys.argv[3] if len(sys.argv) > 3 else None
    workflow, steps = build(shape, log, extra)
    if extra == "in-transaction":
        in_transaction(workflow)
    else:
        queue = await open_queue(Settings.from_env())
        try:
            await workflow.enqueue(queue)
        finally:
            await queue.close()
    print(json.dumps({name: s.id for name, s in steps.items()}))


asyncio.run(main())
