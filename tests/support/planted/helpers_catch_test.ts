// Tests a user might write against the database, most of them wrong on purpose
// (tests/edge/test_edge_test_helpers.py copies it into the function's db_tests/ and reads how
// each fails): the helpers must fail them, saying why.
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler } from "../job.ts";
import {
  assertEnqueued,
  drainQueue,
  testQueueName,
  testStack,
  withFakeDataApi,
} from "../testing.ts";
import { queueClock } from "../testing_clock.ts";

const handlers = {
  // doubles n, or so its author thinks
  double: defineHandler(z.object({ n: z.number() }), ({ n }) => ({ doubled: n * 3 })),
  flaky: defineHandler(z.object({}), (_payload, { job }) => {
    if (job.attempt === 1) throw new Error("the API is down");
    return { attempt: job.attempt };
  }),
  hang: defineHandler(z.object({}), () => new Promise(() => {})),
};

async function enqueue(queue: string, kind: string, payload = {}): Promise<number> {
  return await testStack().queue.enqueue(kind, payload, { queue });
}

Deno.test("wrong enqueue", async () => {
  await withFakeDataApi(async (api) => {
    await api.queue.enqueue("send_email", { to: "bob@example.com", subject: "Hi", text: "." });
    assertEnqueued(api, { kind: "send_email", payload: { to: "ada@example.com" } });
  });
});

Deno.test("wrong result", async () => {
  const queue = testQueueName();
  await enqueue(queue, "double", { n: 2 });
  const ended = await drainQueue(queue, { handlers });
  assert.deepEqual(ended.map(({ outcome, result }) => ({ outcome, result })), [
    { outcome: "done", result: { doubled: 4 } },
  ]);
});

Deno.test("failing handler", async () => {
  const queue = testQueueName();
  await enqueue(queue, "flaky");
  const [job] = await drainQueue(queue, { handlers });
  assert.equal(job.outcome, "done", `#${job.id} ended ${job.outcome}: ${job.error}`);
});

Deno.test("never finishing handler", async () => {
  const queue = testQueueName();
  await enqueue(queue, "double", { n: 1 });
  await enqueue(queue, "hang");
  await drainQueue(queue, { handlers, timeoutMs: 1000 });
});

Deno.test("retry not due without the clock", async () => {
  const queue = testQueueName();
  await enqueue(queue, "flaky");
  await drainQueue(queue, { handlers });
  const [again] = await drainQueue(queue, { handlers });
  assert.equal(again?.outcome, "done", "the retry did not run");
});

Deno.test("retry due once the clock moved", async () => {
  const queue = testQueueName();
  const id = await enqueue(queue, "flaky");
  const [first] = await drainQueue(queue, { handlers });
  assert.equal(first.outcome, "retried");
  assert.ok(first.runAfter !== null && first.runAfter.getTime() > Date.now());
  assert.equal(await queueClock(queue).advance(3600), 1);
  const [again] = await drainQueue(queue, { handlers });
  assert.deepEqual({ id: again.id, outcome: again.outcome, result: again.result }, {
    id,
    outcome: "done",
    result: { attempt: 2 },
  });
});

Deno.test("a schedule fired now", async () => {
  const queue = testQueueName();
  const stack = testStack();
  await stack.queue.schedule(queue, "0 3 * * *", "double", { n: 5 }, queue);
  try {
    const id = await queueClock(queue).fire(queue);
    const [job] = await drainQueue(queue, { handlers });
    assert.deepEqual([job.id, job.kind, job.outcome], [id, "double", "done"]);
  } finally {
    await stack.queue.unschedule(queue);
  }
});

Deno.test("a schedule never defined", async () => {
  await queueClock(testQueueName()).fire("nightly-reprot");
});
