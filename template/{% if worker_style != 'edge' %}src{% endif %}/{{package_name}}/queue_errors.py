# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""What a call to the queue can fail with, the same whatever the transport."""

from __future__ import annotations


class QueueUnavailable(Exception):
    """The database or the Data API cannot be reached right now; retry with backoff."""


class Refused(ValueError):
    """The database refused a call's arguments (a value out of range, a cron schedule pg_cron
    cannot read, an unknown setting) and changed nothing; the message says what and why."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(f"{message} ({hint})" if hint else message)
        self.message = message
        self.hint = hint


class ConfigRefused(Refused):
    """The database refused a configuration change; the message says which setting and why."""


class TooLarge(Refused):
    """The database refused a value over its size limit (SQLSTATE 54000): a result over
    max_result_bytes, progress over 64 KiB, a payload over 1 MiB."""
