-- STAND-IN for Supabase Vault (supabase_vault), which cannot be installed here.
-- Same names and shapes as the real one: vault.create_secret(new_secret, new_name,
-- new_description) returns the secret's uuid, vault.update_secret(...) changes it, and the
-- vault.decrypted_secrets view shows `name` and `decrypted_secret`. Secrets are stored in
-- clear here (the real one encrypts them with pgsodium); like the real one, only privileged
-- roles can read them: nothing is granted to anon, authenticated or PUBLIC.
create schema if not exists vault;
revoke all on schema vault from public;

create table if not exists vault.secrets (
  id uuid primary key default gen_random_uuid(),
  name text unique,
  description text not null default '',
  secret text not null,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
revoke all on vault.secrets from public;

create or replace view vault.decrypted_secrets as
  select id, name, description, secret, secret as decrypted_secret, created_at, updated_at
  from vault.secrets;
revoke all on vault.decrypted_secrets from public;

create or replace function vault.create_secret(
  new_secret text, new_name text default null, new_description text default ''
) returns uuid
language sql security definer set search_path = '' as $$
  insert into vault.secrets (secret, name, description)
  values (new_secret, new_name, coalesce(new_description, ''))
  returning id
$$;

create or replace function vault.update_secret(
  secret_id uuid, new_secret text default null, new_name text default null,
  new_description text default null
) returns void
language sql security definer set search_path = '' as $$
  update vault.secrets
  set secret = coalesce(new_secret, secret),
      name = coalesce(new_name, name),
      description = coalesce(new_description, description),
      updated_at = now()
  where id = secret_id
$$;
revoke all on function vault.create_secret(text, text, text) from public;
revoke all on function vault.update_secret(uuid, text, text, text) from public;
grant usage on schema vault to service_role;
grant select on vault.decrypted_secrets to service_role;
grant execute on function vault.create_secret(text, text, text) to service_role;
grant execute on function vault.update_secret(uuid, text, text, text) to service_role;
