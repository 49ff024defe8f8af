import assert from "node:assert/strict";
import { PermanentError } from "../job.ts";
import { runJob } from "../testing.ts";

Deno.test("a well-formed email is accepted", async () => {
  const ran = await runJob("send_email", { to: "ada@example.com", subject: "Welcome", text: "Hi" });
  assert.equal(ran.result, null);
});

Deno.test("an invalid address fails the job for good, naming the field", async () => {
  await assert.rejects(
    runJob("send_email", { to: "not an address", subject: "Welcome", text: "Hello" }),
    (error: Error) => {
      assert.ok(error instanceof PermanentError);
      assert.match(error.message, /invalid payload for send_email/);
      assert.match(error.message, /to/);
      return true;
    },
  );
});
