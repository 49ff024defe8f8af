import assert from "node:assert/strict";
import { PermanentError } from "../job.ts";
import { jobContext } from "../testing.ts";
import { sendEmail } from "./send_email.ts";

const context = jobContext("send_email", { id: 1 });

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
