# Queue client machinery: you should not need to edit this file (handlers live in handlers/).
"""What a call to the queue can fail with, the same whatever the transport."""

from __future__ import annotations

# How the migrations are applied, for the messages that ask for it.
MIGRATE = "supabase db push, or supabase migration up locally"


class QueueUnavailable(Exception):
    """The database or the Data API cannot be reached right now; retry with backoff."""


class SchemaMissing(Exception):
    """The queue's schema, or a function or view of it, is not in the database: its migrations
    are not (all) applied. Retrying cannot help; the message says what is missing and what to
    do."""

    @classmethod
    def schema(cls, schema: str) -> SchemaMissing:
        return cls(
            f"the queue schema {schema} does not exist in this database: apply the migrations "
            f"first ({MIGRATE})"
        )

    @classmethod
    def part(cls, what: str) -> SchemaMissing:
        """`what` is the database's word for it, e.g. 'function pgqueue.health() does not
        exist'."""
        return cls(
            f"{what}: the queue's migrations are not all applied to this database: apply them "
            f"({MIGRATE})"
        )


class QueueApiError(Exception):
    """The Data API refused a call; the message says why and what to do."""


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
