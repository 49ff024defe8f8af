// Tests against the database (`deno task test:db`, with the local stack: README.md, "Testing
// against the database"): the project's handlers run by the worker's own drain through the
// Data API, each test on a queue of its own.
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, Snooze } from "../job.ts";
import { drainQueue, testQueueName, testStack } from "../testing.ts";
import { queueClock } from "../testing_clock.ts";

Deno.test("a queued email is sent by the drain", async () => {
  const queue = testQueueName();
  const id = await testStack().queue.enqueue("send_email", {
    to: "ada@example.com",
    subject: "Welcome",
    text: "Hi",
  }, { queue });
  const [email] = await drainQueue(queue);
  assert.equal(email.id, id);
  assert.equal(email.outcome, "done");
  assert.equal(email.result, null);
});

Deno.test("a webhook whose receiver is down is retried, then sent after its backoff", async () => {
  let status = 503;
  const receiver = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    async (request) => {
      await request.body?.cancel();
      return new Response(null, { status });
    },
  );
  try {
    const queue = testQueueName();
    const url = `http://127.0.0.1:${receiver.addr.port}/hook`;
    await testStack().queue.enqueue("send_webhook", { url, body: { order: 7 } }, { queue });
    const [first] = await drainQueue(queue);
    assert.equal(first.outcome, "retried");
    assert.match(first.error ?? "", /answered 503/);
    status = 204;
    // its backoff is not over: nothing is due yet, until the queue's clock moves on
    assert.deepEqual((await drainQueue(queue)).map((job) => job.outcome), ["queued"]);
    assert.equal(await queueClock(queue).advance(60), 1);
    const [second] = await drainQueue(queue);
    assert.equal(second.outcome, "done");
    assert.equal(second.attempts, 2);
  } finally {
    await receiver.shutdown();
  }
});

Deno.test("a job whose handler snoozes is run again once the clock reaches its time", async () => {
  // a report that is not ready until the second run: the first snoozes for 5 minutes
  let runs = 0;
  const handlers = {
    build_report: defineHandler(z.object({ month: z.string() }), ({ month }) => {
      runs += 1;
      if (runs === 1) throw new Snooze(300);
      return { month, rows: 42 };
    }),
  };
  const queue = testQueueName();
  await testStack().queue.enqueue("build_report", { month: "2026-11" }, { queue });
  const [first] = await drainQueue(queue, { handlers });
  assert.equal(first.outcome, "snoozed");
  assert.equal(first.attempts, 0, "a snooze spends no attempt");
  assert.ok(first.runAfter && first.runAfter.getTime() - Date.now() > 290_000);
  const [waiting] = await drainQueue(queue, { handlers });
  assert.equal(waiting.outcome, "queued", "not due yet");
  assert.equal(await queueClock(queue).advance(300), 1);
  const [second] = await drainQueue(queue, { handlers });
  assert.deepEqual([second.outcome, second.result], ["done", { month: "2026-11", rows: 42 }]);
});

Deno.test("a job of a kind no handler runs is left waiting, and listed as such", async () => {
  const queue = testQueueName();
  const id = await testStack().queue.enqueue("send_emial", { to: "ada@example.com" }, { queue });
  const [job] = await drainQueue(queue);
  assert.deepEqual([job.id, job.kind, job.outcome, job.attempts], [id, "send_emial", "queued", 0]);
});
