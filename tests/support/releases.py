"""What the release tests share: the answer sets a release is rendered with, and jobs in every
state made with a release's own functions."""

from __future__ import annotations

from psycopg.types.json import Jsonb

EMAIL = {"kind": "send_email", "payload": {"to": "a@example.com", "subject": "s", "text": "t"}}

# Answer sets the release is rendered with: every worker style, both transports, and every
# answer that reaches a migration set away from its default.
RELEASE_ANSWERS = {
    "defaults": {},
    "python-postgres-custom": {
        "claim_transport": "postgres",
        "queue_schema": "background",
        "worker_url": "",
        "max_attempts": 2,
        "retention_days": 1,
    },
    "python-http-custom": {
        "worker_style": "python-http",
        "claim_transport": "postgres",
        "worker_url": "https://worker.example.com/wake",
        "worker_url_setting": "app.wake_url",
        "service_key_setting": "app.wake_key",
        "max_attempts": 9,
        "lease_seconds": 45,
        "retention_days": 3,
        "sweep_schedule": "*/5 * * * *",
    },
    "edge": {"worker_style": "edge", "edge_function_name": "runner", "lease_seconds": 600},
}


def fill_queue(db, schema: str) -> dict[str, list]:
    """Jobs in every state, made with the release's own functions (and the running job's
    lock token)."""
    queued = [i for (i,) in db.execute(f"select {schema}.enqueue_many(%s)", (Jsonb([EMAIL] * 3),))]
    ids = {"queued": queued}
    for state in ("running", "failed", "done"):
        (job_id,) = db.execute(
            f"select {schema}.enqueue(%s, max_attempts => 1, idempotency_key => %s)",
            (state, f"release-{state}"),
        ).fetchone()
        (token,) = db.execute(
            f"select lock_token from {schema}.claim('release-worker', kinds => array[%s])",
            (state,),
        ).fetchone()
        if state == "failed":
            db.execute(f"select {schema}.fail(%s, %s, 'boom')", (job_id, token))
        elif state == "done":
            db.execute(f"select {schema}.complete(%s, %s)", (job_id, token))
        else:
            ids["running_token"] = [token]
        ids[state] = [job_id]
    return ids
