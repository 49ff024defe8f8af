"""e2e_probe_backoff: the probe's handler for a kind with its own backoff, 120 s after the
first failure exactly (no jitter) (template tests)."""

from __future__ import annotations

from ..registry import Backoff, handler
from .e2e_probe import e2e_probe

handler("e2e_probe_backoff", timeout=60, backoff=Backoff(base=120, cap=600, jitter=0))(e2e_probe)
