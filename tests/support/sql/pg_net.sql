-- STAND-IN for pg_net (supabase/pg_net), which cannot be installed here. Same schema, tables
-- and function signatures as pg_net 0.x: net.http_post() only queues the request in
-- net.http_request_queue and returns its id; after the transaction commits, a background
-- worker sends it and stores the outcome in net._http_response. Here that worker is
-- tests/support/pg_net.py, running in the test process. Like the real one: a rolled-back
-- transaction sends nothing, there are no retries, and requests that fail are recorded with
-- error_msg / timed_out.
create schema if not exists net;

create unlogged table if not exists net.http_request_queue (
  id bigserial primary key,
  method text not null,
  url text not null,
  headers jsonb not null,
  body bytea,
  timeout_milliseconds integer not null
);

create unlogged table if not exists net._http_response (
  id bigint,
  status_code integer,
  content_type text,
  headers jsonb,
  content text,
  timed_out boolean,
  error_msg text,
  created timestamptz not null default now()
);

create or replace function net.http_post(
  url text,
  body jsonb default '{}'::jsonb,
  params jsonb default '{}'::jsonb,
  headers jsonb default '{"Content-Type": "application/json"}'::jsonb,
  timeout_milliseconds integer default 5000
) returns bigint
language plpgsql
volatile
security definer
set search_path = ''
as $$
declare
  request_id bigint;
  query text;
begin
  -- pg_net appends params as a query string and sends the body as UTF-8 JSON text.
  select string_agg(format('%s=%s', key, value), '&') into query
  from jsonb_each_text(coalesce(params, '{}'::jsonb));
  insert into net.http_request_queue (method, url, headers, body, timeout_milliseconds)
  values (
    'POST',
    url || coalesce('?' || query, ''),
    coalesce(headers, '{}'::jsonb),
    convert_to(coalesce(body, 'null'::jsonb)::text, 'UTF8'),
    timeout_milliseconds
  )
  returning id into request_id;
  return request_id;
end;
$$;

grant usage on schema net to postgres, service_role;
revoke all on function net.http_post(text, jsonb, jsonb, jsonb, integer) from public;
grant execute on function net.http_post(text, jsonb, jsonb, jsonb, integer) to postgres, service_role;
