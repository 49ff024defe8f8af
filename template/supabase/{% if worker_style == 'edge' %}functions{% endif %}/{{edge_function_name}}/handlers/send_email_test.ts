import assert from "node:assert/strict";
import { type JobContext, PermanentError } from "../job.ts";
import { sendEmail } from "./send_email.ts";

const context: JobContext = {
  job: { id: 1, kind: "send_email", queue: "default", attempt: 1, maxAttempts: 5 },
  signal: new AbortController().signal,
};

Deno.test("a well-formed email is accepted", async () => {
  await sendEmail({ to: "ada@example.com", subject: "Welcome", text: "Hello" }, context);
});

Deno.test("an invalid address fails the job for good, naming the field", async () => {
  await assert.rejects(
    sendEmail({ to: "not an address", subject: "Welcome", text: "Hello" }, context),
    (error: Error) => {
      assert.ok(error instanceof PermanentError);
      assert.match(error.message, /invalid payload for send_email/);
      assert.match(error.message, /to/);
      return true;
    },
  );
});
