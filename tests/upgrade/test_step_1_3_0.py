"""What 1.3.0's step moves for a project of 1.2.0 with live jobs: the tables 1.3.0 merged into
others keep their data in the new shape."""

from __future__ import annotations

from pathlib import Path

from testkit.hosted import start_hosted_cluster
from testkit.project import RELEASES, push_migrations, render_repo, supabase, update


def released(db, job_id: int) -> None:
    """Claims the job (due now) and hands it back, as a worker shutting down does."""
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (job_id,))
    (token,) = db.execute(
        "select lock_token from pgqueue.claim('step-worker', kinds => array['released'])"
    ).fetchone()
    assert db.execute("select pgqueue.release(%s, %s)", (job_id, token)).fetchone() == (True,)


def test_the_step_moves_the_releases_in_a_row_of_queued_and_running_jobs(
    history: Path, tmp_path: Path
) -> None:
    """A job's count of releases in a row (1.2.0's job_releases) goes with the job: a queued
    job released twice and a running one released once keep counting where they were."""
    project = render_repo(
        history, tmp_path / "app", "generated at 1.2.0", vcs_ref=RELEASES["1.2.0"]
    )
    cluster = start_hosted_cluster()
    try:
        push_migrations(project, cluster.url())
        with cluster.connect(autocommit=True) as db:
            queued, running = [
                db.execute("select pgqueue.enqueue('released', priority => %s)", (p,)).fetchone()[0]
                for p in (1, 0)
            ]
            for _ in range(2):
                released(db, queued)
            db.execute(
                "update pgqueue.jobs set run_after = now() + interval '1 hour' where id = %s",
                (queued,),
            )
            released(db, running)
            db.execute("update pgqueue.jobs set run_after = now() where id = %s", (running,))
            (token,) = db.execute(
                "select lock_token from pgqueue.claim('step-worker', kinds => array['released'])"
            ).fetchone()
        update(project, "HEAD")
        supabase(project, "migration", "up", "--db-url", cluster.url())
        with cluster.connect(autocommit=True) as db:
            assert db.execute("select to_regclass('pgqueue.job_releases')").fetchone() == (None,)
            assert db.execute(
                "select releases from pgqueue.jobs where id = %s", (queued,)
            ).fetchone() == (2,)
            assert db.execute(
                "select e.releases from pgqueue.claims as c, unnest(c.jobs) as e where e.id = %s",
                (running,),
            ).fetchone() == (1,)
            # the running job's second release in a row, then the queued job's third: counted
            assert db.execute("select pgqueue.release(%s, %s)", (running, token)).fetchone() == (
                True,
            )
            released(db, queued)
            attempts = dict(
                db.execute(
                    "select id, attempts from pgqueue.jobs where id = any (%s)",
                    ([queued, running],),
                )
            )
    finally:
        cluster.destroy()
    assert attempts == {queued: 1, running: 0}
