# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""The event loop the worker's commands run on: uvloop's where installed, in a process whose
garbage collector is tuned for a long-running worker."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# New objects between two collections of the garbage collector's youngest generation (Python's
# default is 700): see tune_garbage_collector().
_GC_YOUNG_OBJECTS = 5000


def run_until_complete(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), on uvloop's event loop where uvloop is installed (a dependency on
    Linux and macOS; it has no Windows build): the worker schedules a task per job, and
    uvloop's scheduling costs less of its CPU than asyncio's own loop (measured in
    pgqueue-template's docs/maintainers/performance-log.md).
    The garbage collector is tuned for a long-running worker first (tune_garbage_collector)."""
    tune_garbage_collector()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def tune_garbage_collector() -> None:
    """Make Python's cyclic garbage collector cheaper for a worker, which runs for long and
    keeps hundreds of jobs' tasks alive. Refcounting still frees every object at once; this
    only changes how often the collector walks the live ones looking for cycles:
    - gc.freeze(): what is loaded by now (modules, handlers, settings, clients) lives as long
      as the process, so later collections no longer walk it;
    - the youngest generation is collected after _GC_YOUNG_OBJECTS new objects instead of
      Python's 700, so a busy worker collects about once a claim, not several times.
    Together they take about a sixth off the worker's own CPU time per job
    (pgqueue-template's docs/maintainers/performance-log.md)."""
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
