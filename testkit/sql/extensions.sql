-- The extensions a Supabase database has, created the way Supabase documents them. Both are
-- the real ones (built by scripts/setup); the servers preload their libraries
-- (testkit/cluster.py). pg_net puts its objects in schema `net` whatever schema it is
-- created "with"; Vault's control file pins schema `vault`.
create extension if not exists pg_net with schema extensions;
create extension if not exists supabase_vault cascade;
