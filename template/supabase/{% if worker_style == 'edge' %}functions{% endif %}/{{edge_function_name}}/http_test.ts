import assert from "node:assert/strict";
import { z } from "zod";
import { createWakeHandler, parseWake } from "./http.ts";
import { defineHandler } from "./job.ts";
import type { Settings } from "./settings.ts";
import { MemoryQueue } from "./testing.ts";
import type { DrainSummary } from "./worker.ts";

const settings: Settings = {
  supabaseUrl: "http://127.0.0.1:54321",
  serviceKeys: ["service-key"],
  schema: "pgqueue",
  batchSize: 10,
  timeBudgetMs: 10_000,
  lingerMs: 0,
  lingerPollMs: 10,
};

const handlers = { ok: defineHandler(z.object({}), () => {}) };

function wake(authorization: string | null, body = '{"reason":"enqueue","queues":["default"]}') {
  const headers = new Headers({ "Content-Type": "application/json" });
  if (authorization !== null) headers.set("Authorization", authorization);
  return new Request("http://localhost/job-worker", { method: "POST", headers, body });
}

function setUp(overrides: Partial<Settings> = {}) {
  const queue = new MemoryQueue();
  const pending: Promise<unknown>[] = [];
  const summaries: DrainSummary[] = [];
  const handle = createWakeHandler({
    settings: { ...settings, ...overrides },
    queue,
    handlers,
    waitUntil: (work) => pending.push(work),
    onDrained: (summary) => summaries.push(summary),
    log: () => {},
  });
  return { queue, pending, summaries, handle };
}

Deno.test("a wake-up with the service key is answered 202 and the jobs run after", async () => {
  const { queue, pending, summaries, handle } = setUp();
  queue.add("ok");
  queue.add("ok");

  const response = await handle(wake("Bearer service-key"));

  assert.equal(response.status, 202);
  const body = await response.json();
  assert.equal(body.accepted, true);
  assert.equal(body.joined, false);
  assert.deepEqual(body.queues, ["default"]);
  assert.equal(pending.length, 1, "the work is handed to waitUntil");
  await Promise.all(pending);
  assert.deepEqual(queue.byStatus("done"), [1, 2]);
  assert.equal(summaries[0].completed, 2);
});

Deno.test("a wake-up while a drain lingers joins it instead of starting another", async () => {
  const { queue, pending, summaries, handle } = setUp({ lingerMs: 500, lingerPollMs: 10 });
  queue.add("ok");
  const first = await (await handle(wake("Bearer service-key"))).json();
  while (queue.byStatus("done").length === 0) await new Promise((r) => setTimeout(r, 5));

  queue.add("ok");
  const second = await handle(wake("Bearer service-key"));
  const other = await handle(wake("Bearer service-key", '{"queues":["default","emails"]}'));

  assert.equal(second.status, 202);
  assert.equal(first.joined, false);
  assert.equal((await second.json()).joined, true);
  assert.equal((await other.json()).joined, false, "a queue the drain does not cover");
  assert.equal(pending.length, 3, "each wake-up hands its work to waitUntil");
  assert.equal(pending[1], pending[0], "the joined wake-up waits for the drain it joined");
  await Promise.all(pending);
  assert.deepEqual(queue.byStatus("done"), [1, 2]);
  assert.deepEqual(summaries.map((summary) => summary.wakeUps).sort(), [1, 2]);
});

Deno.test("a wrong or missing key is refused with 403 and claims nothing", async () => {
  const { queue, pending, handle } = setUp();
  queue.add("ok");

  for (const authorization of ["Bearer wrong-key", "Bearer Service-Key", "service-key", null]) {
    const response = await handle(wake(authorization));
    assert.equal(response.status, 403, `Authorization: ${authorization}`);
    assert.match((await response.json()).error, /Bearer <service key>/);
  }
  assert.equal(pending.length, 0);
  assert.equal(queue.calls.length, 0);
});

Deno.test("only POST wakes the worker", async () => {
  const { handle } = setUp();
  const response = await handle(new Request("http://localhost/job-worker"));
  assert.equal(response.status, 405);
  assert.equal(response.headers.get("Allow"), "POST");
  await response.body?.cancel();
});

Deno.test("a malformed body is answered 400", async () => {
  const { handle } = setUp();
  const response = await handle(wake("Bearer service-key", '{"queues": "default"}'));
  assert.equal(response.status, 400);
  assert.match((await response.json()).error, /"queues" must be a list/);
});

Deno.test("the wake-up body names the queues; an empty one means the default queue", () => {
  assert.deepEqual(parseWake('{"reason":"sweep","queues":["a","b"]}'), {
    reason: "sweep",
    queues: ["a", "b"],
  });
  assert.deepEqual(parseWake(""), { reason: "manual", queues: ["default"] });
  assert.deepEqual(parseWake("{}"), { reason: "manual", queues: ["default"] });
  assert.throws(() => parseWake("not json"), /it is not JSON/);
  assert.throws(() => parseWake('{"queues": []}'), /must be a list of queue names/);
});
