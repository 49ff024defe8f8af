"""Standard Webhooks signatures of wake-ups, with the `standardwebhooks` library that the
python-http worker verifies with: tests check the database's signatures with it and sign
wake-ups of their own (forged, stale, replayed) to send to the workers."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from tests.support.http_sink import Request


def secret_for(words: str) -> str:
    """A wake-up secret as Standard Webhooks writes one (`whsec_` and base64), made of `words`
    so that a test says whose it is."""
    return "whsec_" + base64.b64encode(words.encode()).decode()


def verified(request: Request, secret: str) -> object:
    """The wake-up's parsed body, if `secret` signed it and it is fresh; otherwise the library
    raises WebhookVerificationError."""
    return Webhook(secret).verify(request.body, request.headers)


def signed(
    secret: str,
    body: bytes,
    *,
    message_id: str | None = None,
    at: datetime | None = None,
) -> dict[str, str]:
    """The headers of a wake-up of `body` signed with `secret` (now, with a fresh id, unless
    told otherwise), as the database signs one."""
    message_id = message_id or f"wake_{uuid.uuid4()}"
    at = at or datetime.now(tz=UTC)
    return {
        "Content-Type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, at, body),
    }


def post_wake(url: str, secret: str, payload: object = None, **kwargs: object) -> httpx.Response:
    """POSTs to `url` a wake-up of `payload` ({"queues": ["default"]} by default) signed with
    `secret`, as the database sends one."""
    body = json.dumps({"queues": ["default"]} if payload is None else payload).encode()
    return httpx.post(url, content=body, headers=signed(secret, body), **kwargs)
