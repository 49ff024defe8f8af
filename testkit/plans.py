"""The query plans of what a block of code runs: auto_explain, nested statements (those a
function runs) included, for the tests that a statement reads a table through its index and
the benchmarks that print which indexes a statement reads (bench/job_list.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def plans_logged(db: psycopg.Connection) -> Iterator[list[str]]:
    """Yields a list that fills with the plan of every statement `db` runs inside the block,
    nested ones included (auto_explain at log level, read as notices)."""
    plans: list[str] = []
    db.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    db.execute(
        "load 'auto_explain'; set auto_explain.log_min_duration = 0;"
        " set auto_explain.log_nested_statements = on; set client_min_messages = log"
    )
    try:
        yield plans
    finally:
        db.execute("reset client_min_messages; set auto_explain.log_min_duration = -1")
