-- `bench/run --hot-path-steps`: the job tables and old functions of the scratch steps between
-- the claim() + complete_many() loop of the earlier migrations and the hot path of migration
-- 20261203000003. bench/hot_path_steps.py builds each step's schema, `{s}` below, from the
-- blocks its STEPS entry names (a block runs from its `-- block:` line to the next one), then
-- adds what it takes from the rendered hot-path migration itself: its job_history and
-- done_batches tables with their indexes, and its complete_and_claim(), rewritten there
-- (REWRITES) to undo the later steps' changes.

-- block: jobs_before
-- The job table as before the migration: pgqueue.jobs's columns, defaults, identity and
-- checks, and the storage settings and indexes of migration 20261202000000. The claim index
-- (and every other partial index) names the status in its predicate, so a claim, which sets
-- the status, is never a HOT update: it adds an entry to the primary key and to the index
-- whose predicate the new row version meets (jobs_lease_expiry_idx), and so does
-- complete_many()'s update to 'done' (jobs_finished_idx).
create table {s}.jobs (like pgqueue.jobs including all excluding indexes) with (
  fillfactor = 70,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
alter table {s}.jobs add constraint jobs_pkey primary key (id);
create index jobs_claim_idx on {s}.jobs (queue, priority desc, run_after, id)
  where status = 'queued';
create index jobs_lease_expiry_idx on {s}.jobs (locked_until) where status = 'running';
create index jobs_finished_idx on {s}.jobs (finished_at)
  where status in ('done', 'failed', 'cancelled');
create unique index jobs_idempotency_key_idx on {s}.jobs (idempotency_key)
  where idempotency_key is not null;
-- Later migrations added columns to pgqueue.jobs (20261203000004: concurrency_key, progress);
-- the steps' job tables are as they were before those.
alter table {s}.jobs drop column concurrency_key, drop column progress;

-- block: hot_table
-- The job table as migrated (steps hot_claims to flow_control): pages are filled to half, to
-- leave a claim's new row version room on its page; a block below adds its claim indexes.
create table {s}.jobs (like pgqueue.jobs including all excluding indexes) with (
  fillfactor = 50,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
alter table {s}.jobs add constraint jobs_pkey primary key (id);
create unique index jobs_idempotency_key_idx on {s}.jobs (idempotency_key)
  where idempotency_key is not null;

-- block: checks_then
-- The checks of those steps' time (after jobs_before or hot_table): the job table held running
-- and finished jobs too. (Migration 20261203000010 replaced these three with
-- jobs_queued_check, which `like` copies.)
alter table {s}.jobs
  drop constraint jobs_queued_check,
  add constraint jobs_status_check
    check (status in ('queued', 'running', 'done', 'failed', 'cancelled')),
  add constraint jobs_lease_check
    check ((status = 'running') = (lock_token is not null and locked_until is not null)),
  add constraint jobs_finished_check
    check ((status in ('done', 'failed', 'cancelled')) = (finished_at is not null));

-- block: jobs_hot
-- As migration 20261203000003 left it (steps hot_claims and done_batches): the claim index
-- covers every live job, without a status predicate, and there is no lease or finished index,
-- so no index names a column that a claim changes. A claim is then a HOT update: no index
-- entry at all.
create index jobs_claim_idx on {s}.jobs (queue, priority desc, run_after, id);
-- Later migrations added columns to pgqueue.jobs (20261203000004: concurrency_key, progress);
-- the steps' job tables are as they were before those.
alter table {s}.jobs drop column concurrency_key, drop column progress;

-- block: jobs_flow
-- As the flow-control migration (20261203000004) left it (step flow_control): concurrency
-- keys, whose jobs the claim index leaves to an index of their own, and progress. Claims are
-- still HOT updates.
create index jobs_claim_idx on {s}.jobs (queue, priority desc, run_after, id)
  where concurrency_key is null;
create index jobs_concurrency_idx on {s}.jobs
  (queue, concurrency_key, priority desc, run_after, id)
  where concurrency_key is not null;

-- block: two_calls
-- claim() as migration 20261203000000 left it (migration 20261202000001's, with the
-- configured lease) and complete_many() as migration 20261202000001 wrote it: two calls and
-- two transactions per batch, a fresh token per job, every column of the claimed jobs
-- returned, and a done job kept in the job table.
create function {s}.claim(
  worker text,
  max_jobs integer default 1,
  kinds text[] default null,
  queue text default 'default',
  lease_seconds integer default null
)
returns setof {s}.jobs
language plpgsql
volatile
security definer
set search_path = ''
as $$
#variable_conflict use_column
declare
  lease integer := claim.lease_seconds;
begin
  if claim.max_jobs is null or claim.max_jobs < 1 or claim.max_jobs > 10000 then
    raise exception 'max_jobs must be between 1 and 10000, got %', claim.max_jobs
      using errcode = '22023';
  end if;
  if lease is null then
    select c.lease_seconds into lease from pgqueue.config as c;
  elsif lease < 1 then
    raise exception 'lease_seconds must be at least 1, got %', lease
      using errcode = '22023';
  end if;

  return query
    with candidates as materialized (
      select j.id
      from {s}.jobs as j
      where j.status = 'queued'
        and j.queue = claim.queue
        and j.run_after <= now()
        and (claim.kinds is null or j.kind = any (claim.kinds))
      order by j.priority desc, j.run_after, j.id
      limit claim.max_jobs
      for update skip locked
    )
    update {s}.jobs as j
    set status = 'running',
        attempts = j.attempts + 1,
        locked_at = now(),
        locked_until = now() + make_interval(secs => lease),
        locked_by = claim.worker,
        lock_token = gen_random_uuid()
    from candidates as c
    where j.id = c.id
    returning j.*;
end;
$$;

create function {s}.complete_many(job_ids bigint[], lock_tokens uuid[])
returns setof bigint
language sql
volatile
security definer
set search_path = ''
as $$
  update {s}.jobs as j
  set status = 'done', finished_at = now(), locked_until = null, lock_token = null
  from unnest(complete_many.job_ids, complete_many.lock_tokens) as t(id, token)
  where j.id = t.id
    and j.lock_token = t.token
  returning j.id
$$;
