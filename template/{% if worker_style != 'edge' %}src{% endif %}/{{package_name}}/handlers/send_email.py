"""send_email: a stub to replace with your email provider's API call."""

from __future__ import annotations

import logging

from pydantic import BaseModel, Field

from ..registry import JobInfo, handler

log = logging.getLogger(__name__)


class EmailPayload(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    text: str


@handler("send_email", timeout=60)
async def send_email(payload: EmailPayload, job: JobInfo) -> None:
    # Replace with your provider, e.g. (Resend, with its API key in the environment):
    #   async with httpx.AsyncClient() as client:
    #       response = await client.post(
    #           "https://api.resend.com/emails",
    #           headers={"Authorization": f"Bearer {os.environ['RESEND_API_KEY']}"},
    #           json={"from": "...", "to": payload.to, "subject": payload.subject,
    #                 "text": payload.text},
    #       )
    #       response.raise_for_status()
    # Pass f"job-{job.id}" as the provider's idempotency key if it has one: a job can run
    # again after a crash, and the key keeps the customer from getting the email twice.
    log.info(
        "email not sent (stub)",
        extra={"event": "email.stub", "job_id": job.id, "to": payload.to},
    )
