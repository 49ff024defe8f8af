-- The auth helpers as GoTrue's own migrations leave them on a Supabase project: they read the
-- claims PostgREST sets in `request.jwt.claims` (or the older per-claim `request.jwt.claim`).
-- supabase/postgres's init scripts create older versions that GoTrue replaces.
create or replace function auth.jwt() returns jsonb
language sql stable as $$
  select coalesce(
    nullif(current_setting('request.jwt.claim', true), ''),
    nullif(current_setting('request.jwt.claims', true), '')
  )::jsonb
$$;

create or replace function auth.role() returns text
language sql stable as $$ select auth.jwt() ->> 'role' $$;

create or replace function auth.uid() returns uuid
language sql stable as $$ select nullif(auth.jwt() ->> 'sub', '')::uuid $$;
