# Test helper machinery: you should not need to edit this file (handlers live in handlers/).
"""Helpers for the project's own tests (the README's "Testing your handlers" shows each).

- handlers.py: run_job(), one handler run directly with a made-up job, no database
- fixtures.py: pytest fixtures against the test database: assert_enqueued, refute_enqueued,
  drain_queue, queue_clock (tests/conftest.py loads them)
- jobs.py: what the fixtures read and run (the jobs enqueued, a queue drained in-process)
- clock.py: the queue's clock moved for a test (queued jobs made due sooner)
"""

from .handlers import HandlerRun, HandlerTimedOut, InvalidPayload, run_job, run_job_async

__all__ = ["HandlerRun", "HandlerTimedOut", "InvalidPayload", "run_job", "run_job_async"]
