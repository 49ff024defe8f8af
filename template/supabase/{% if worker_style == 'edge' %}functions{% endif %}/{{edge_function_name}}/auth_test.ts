import assert from "node:assert/strict";
import { bearerCheck } from "./auth.ts";

Deno.test("the service key is accepted, as a bearer token only", async () => {
  const isAuthorized = bearerCheck(["service-key", "sb_secret_other"]);
  assert.equal(await isAuthorized("Bearer service-key"), true);
  assert.equal(await isAuthorized("bearer sb_secret_other"), true);
  assert.equal(await isAuthorized("Bearer service-key2"), false);
  assert.equal(await isAuthorized("Bearer service-ke"), false);
  assert.equal(await isAuthorized("Basic service-key"), false);
  assert.equal(await isAuthorized("service-key"), false);
  assert.equal(await isAuthorized(null), false);
});

Deno.test("an empty bearer never matches, even with no keys configured", async () => {
  assert.equal(await bearerCheck([])("Bearer "), false);
  assert.equal(await bearerCheck([])(null), false);
  assert.equal(await bearerCheck(["key"])("Bearer "), false);
});
