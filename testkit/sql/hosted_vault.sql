-- What a hosted Supabase project grants on Vault 0.3 (supabase/postgres runs the equivalent as
-- supautils' after-create script for supabase_vault since Vault 0.3.0; the set-up in
-- ../shared/vendor/ predates it, from when Vault's access came with pgsodium's roles).
-- Vault 0.3 itself revokes its functions from PUBLIC and grants nothing.
grant usage on schema vault to postgres with grant option;
grant select, delete, truncate, references on vault.secrets, vault.decrypted_secrets
  to postgres with grant option;
grant execute on function vault.create_secret, vault.update_secret, vault._crypto_aead_det_decrypt
  to postgres with grant option;

-- service_role could manage secrets under Vault 0.2.8 (through pgsodium) and keeps that
grant usage on schema vault to service_role;
grant select, delete on vault.secrets, vault.decrypted_secrets to service_role;
grant execute on function vault.create_secret, vault.update_secret, vault._crypto_aead_det_decrypt
  to service_role;
