# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""What handlers return and report, as the JSON text the queue stores, checked before it goes.

A handler's return value becomes its job's result, and `job.report_progress(...)` its progress:
a dict, list, str, number or bool, or a pydantic model (dumped with `model_dump(mode="json")`,
wherever it appears); None is no result. The worker writes it as compact UTF-8 JSON and checks
that text's size: a result against max_result_bytes (the queue's configuration, read when the
worker starts), progress against 64 KiB. The database measures the jsonb it stores instead,
which is often larger (every number and small value has a few bytes of overhead), and refuses a
result over its limit too: then the worker fails that job with the database's measure
(worker/completions.py).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel

from .client import JsonText

# The largest progress the database stores (jobs_progress_size_check).
MAX_PROGRESS_BYTES = 65536

# What to do about a value over its limit.
STORE_ELSEWHERE = "store large data elsewhere (e.g. Supabase Storage) and pass a reference"

# \u0000 in JSON text, not preceded by an escaped backslash: jsonb cannot store it.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class NotStorable(ValueError):
    """A result or progress the queue cannot store: not JSON, or over its size limit."""


def to_json_text(
    value: object, *, what: str, limit: int, limit_name: str | None = None
) -> JsonText:
    """`value` as compact JSON text of at most `limit` bytes; NotStorable otherwise, naming
    `what` (e.g. "the result of job 42 ('report')") and the limit (`limit_name`, the setting
    it comes from)."""
    try:
        text = json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_dump_model
        )
        size = len(text.encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotStorable(
            f"{what} is not JSON ({exc}): return a dict, list, str, number, bool or pydantic model"
        ) from exc
    if _NUL.search(text):
        raise NotStorable(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    if size > limit:
        setting = f" ({limit_name})" if limit_name else ""
        raise NotStorable(
            f"{what} is {size} bytes of JSON; the limit is {limit}{setting}: {STORE_ELSEWHERE}"
        )
    return JsonText(text)


def _dump_model(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
