"""send_webhook: POST an event to a customer's endpoint, signed so they can verify it."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

import httpx
from pydantic import BaseModel, HttpUrl

from ..registry import JobInfo, PermanentError, handler

# Statuses that mean "do not send this again": anything 4xx except these retryable ones.
_RETRYABLE_CLIENT_ERRORS = {408, 409, 425, 429}


class WebhookPayload(BaseModel):
    url: HttpUrl
    event: str
    data: dict[str, Any] = {}


@handler("send_webhook", timeout=30)
async def send_webhook(payload: WebhookPayload, job: JobInfo) -> None:
    body = json.dumps({"event": payload.event, "data": payload.data}, separators=(",", ":"))
    headers = {
        "Content-Type": "application/json",
        # The same id on every attempt, so the receiver can drop duplicates.
        "Webhook-Id": f"job-{job.id}",
    }
    if secret := os.environ.get("WEBHOOK_SIGNING_SECRET"):
        digest = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
        headers["Webhook-Signature"] = f"sha256={digest}"
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(str(payload.url), content=body, headers=headers)
    if response.is_client_error and response.status_code not in _RETRYABLE_CLIENT_ERRORS:
        raise PermanentError(f"{payload.url} answered {response.status_code}: not retrying")
    response.raise_for_status()
