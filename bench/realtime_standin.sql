-- Stand-in for Supabase Realtime's broadcast table and realtime.send(), which pgflow's SQL
-- calls on every step and run event (bench/workflow_peers.py applies it before pgflow's
-- migrations). On a Supabase project the Realtime server creates both; this machine has no
-- Realtime. Benchmark only: never in a generated project.
--
-- Shaped as Realtime creates them, so pgflow pays here what it pays on Supabase: each event is
-- one insert into realtime.messages (partitioned by inserted_at, primary key (id, inserted_at),
-- a partial index for private topics), the topic set for the transaction first, and an error
-- turned into a warning. Realtime makes a partition a day; one default partition holds them
-- here (an insert is routed to one leaf either way).
create schema if not exists realtime;

create table realtime.messages (
  topic text not null,
  extension text not null,
  payload jsonb,
  event text,
  private boolean default false,
  updated_at timestamp without time zone not null default now(),
  inserted_at timestamp without time zone not null default now(),
  id uuid not null default gen_random_uuid(),
  primary key (id, inserted_at)
) partition by range (inserted_at);

create index messages_inserted_at_topic_index on realtime.messages (inserted_at desc, topic)
  where extension = 'broadcast' and private is true;

alter table realtime.messages enable row level security;

create table realtime.messages_default partition of realtime.messages default;

create function realtime.send(payload jsonb, event text, topic text, private boolean default true)
returns void
language plpgsql
as $$
begin
  begin
    execute format('set local realtime.topic to %L', topic);
    insert into realtime.messages (payload, event, topic, private, extension)
    values (payload, event, topic, private, 'broadcast');
  exception
    when others then
      raise warning 'ErrorSendingBroadcastMessage: %', sqlerrm;
  end;
end;
$$;
