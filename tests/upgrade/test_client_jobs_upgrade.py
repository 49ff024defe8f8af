"""Users' jobs through the step from 1.1.0 (docs/upgrading.md, "From 1.1.0 to 1.2.0"): a job
that failed with a text beginning `UserFacingError: ` (all 1.1.0 went by) shows its owner no
error after the step, users' queued jobs move below the app's, the caps count what is live,
and a 1.1.0 caller of allow_client_kind() with two arguments still finds it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg

from testkit.hosted import start_hosted_cluster
from testkit.project import RELEASES, push_migrations, render_repo, supabase, update

KIND = "export_data"


def submit(db: psycopg.Connection, user: uuid.UUID) -> int:
    """One job submitted by `user`, as the Data API runs client_enqueue() for them."""
    claims = json.dumps({"role": "authenticated", "sub": str(user)})
    with db.transaction():
        db.execute("select set_config('role', 'authenticated', true)")
        db.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
        return db.execute("select pgqueue_public.client_enqueue(%s)", (KIND,)).fetchone()[0]


def my_jobs(db: psycopg.Connection, user: uuid.UUID) -> dict[int, tuple[str, str | None]]:
    claims = json.dumps({"role": "authenticated", "sub": str(user)})
    with db.transaction():
        db.execute("select set_config('role', 'authenticated', true)")
        db.execute("select set_config('request.jwt.claims', %s, true)", (claims,))
        rows = db.execute("select id, status, error from pgqueue_public.my_jobs").fetchall()
    return {job_id: (status, error) for job_id, status, error in rows}


def test_the_step_from_1_1_0_shows_no_error_told_by_its_text_and_caps_what_is_live(
    history: Path, tmp_path: Path
) -> None:
    project = render_repo(
        history, tmp_path / "app", "generated at 1.1.0", vcs_ref=RELEASES["1.1.0"]
    )
    user = uuid.uuid4()
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            db.execute("update cron.job set active = false")
            db.execute("select pgqueue.allow_client_kind(%s, 60)", (KIND,))
            failed, queued = submit(db, user), submit(db, user)
            (token,) = db.execute(
                "select lock_token from pgqueue.claim('w', 1, kinds => array[%s])", (KIND,)
            ).fetchone()
            db.execute(
                "select pgqueue.fail(%s, %s, 'UserFacingError: db password is hunter2',"
                " retryable => false)",
                (failed, token),
            )
            assert my_jobs(db, user)[failed] == ("failed", "db password is hunter2"), (
                "1.1.0 showed any error whose text began so"
            )

        update(project, "HEAD")
        supabase(project, "migration", "up", "--db-url", cluster.url())

        with cluster.connect(autocommit=True) as db:
            assert my_jobs(db, user) == {failed: ("failed", None), queued: ("queued", None)}
            (last_error,) = db.execute(
                "select last_error from pgqueue.job(%s)", (failed,)
            ).fetchone()
            assert last_error == "UserFacingError: db password is hunter2", "kept, for the app"
            assert db.execute("select priority from pgqueue.job(%s)", (queued,)).fetchone() == (
                -32768,
            )
            caps = "select per_minute, max_per_user, max_total, live from pgqueue.client_kinds"
            assert db.execute(caps).fetchall() == [(60, 100, 10_000, 1)]
            # a caller of 1.1.0 (two arguments) changes the rate and keeps the caps
            db.execute("select pgqueue.allow_client_kind(%s, 30)", (KIND,))
            assert db.execute(caps).fetchall() == [(30, 100, 10_000, 1)]
    finally:
        cluster.destroy()
