# Dashboard machinery: you should not need to edit this file.
"""What every page and action shares about a request: the refusal of one (an error page of its
own), and a posted form's fields, read with a bound."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request

# A form here holds a password or a token, an id or a job list's filters: a few hundred bytes.
MAX_FORM_BYTES = 16 * 1024


class Refusal(Exception):
    """A request answered with an error page: its status and what to tell the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_form(request: Request) -> dict[str, str]:
    """A URL-encoded form's fields (the first value of each), read up to MAX_FORM_BYTES. A
    body of another type has no fields (so no password and no token)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        return {}
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refusal(413, "That form is too large.")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        raise Refusal(400, "That form could not be read.") from None
    return {name: values[0] for name, values in fields.items()}
