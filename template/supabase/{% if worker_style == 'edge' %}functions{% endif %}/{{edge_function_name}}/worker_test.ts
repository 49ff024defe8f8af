import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, type HandlerMap, PermanentError } from "./job.ts";
import { MemoryQueue } from "./testing.ts";
import { drain, type DrainOptions, type LogEvent } from "./worker.ts";

const ran: number[] = [];

const handlers: HandlerMap = {
  ok: defineHandler(z.object({ n: z.number() }), ({ n }) => {
    ran.push(n);
  }),
  boom: defineHandler(z.object({}), () => {
    throw new Error("the upstream API is down");
  }),
  refused: defineHandler(z.object({}), () => {
    throw new PermanentError("the account was deleted");
  }),
  slow: defineHandler(z.object({}), (_payload, { signal }) =>
    new Promise((_resolve, reject) => {
      signal.addEventListener("abort", () => reject(signal.reason));
    })),
};

function options(queue: MemoryQueue, overrides: Partial<DrainOptions> = {}): DrainOptions {
  return {
    queue,
    handlers,
    workerId: "test-worker",
    batchSize: 3,
    timeBudgetMs: 10_000,
    log: () => {},
    ...overrides,
  };
}

Deno.test("every job runs once and is completed, a batch at a time", async () => {
  ran.length = 0;
  const queue = new MemoryQueue();
  for (let n = 1; n <= 7; n++) queue.add("ok", { n });
  queue.add("not_ours");

  const summary = await drain(["default"], options(queue));

  assert.deepEqual(ran.sort((a, b) => a - b), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(queue.byStatus("done"), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(queue.byStatus("queued"), [8], "kinds without a handler are not claimed");
  assert.equal(summary.claimed, 7);
  assert.equal(summary.completed, 7);
  assert.equal(summary.stoppedBy, "empty");
  assert.deepEqual(queue.claims.map((claim) => claim.maxJobs), [3, 3, 3]);
  assert.deepEqual(queue.claims[0].kinds.sort(), ["boom", "ok", "refused", "slow"]);
  assert.equal(queue.claims[0].worker, "test-worker");
  assert.equal(queue.claims[0].leaseSeconds, undefined, "the database's lease applies");
});

Deno.test("a failing job never stops the batch, and its error is stored", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const boom = queue.add("boom");
  queue.add("ok", { n: 2 });

  const summary = await drain(["default"], options(queue, { batchSize: 10 }));

  assert.deepEqual(queue.byStatus("done"), [1, 3]);
  assert.equal(boom.status, "queued", "a plain error is retried");
  assert.match(boom.lastError ?? "", /^Error: the upstream API is down\n\s+at /);
  assert.equal(summary.retried, 1);
  assert.equal(summary.completed, 2);
});

Deno.test("retries end in the dead letters once attempts are used up", async () => {
  const queue = new MemoryQueue();
  const boom = queue.add("boom", {}, { maxAttempts: 2 });

  const first = await drain(["default"], options(queue));
  const second = await drain(["default"], options(queue));

  assert.equal(first.retried, 1);
  assert.equal(second.deadLettered, 1);
  assert.equal(boom.status, "failed");
  assert.equal(boom.attempts, 2);
});

Deno.test("invalid payloads and permanent errors are dead-lettered at once", async () => {
  const queue = new MemoryQueue();
  const invalid = queue.add("ok", { n: "one" });
  const refused = queue.add("refused");

  const summary = await drain(["default"], options(queue));

  assert.equal(invalid.status, "failed");
  assert.match(invalid.lastError ?? "", /invalid payload for ok:[\s\S]*n/);
  assert.equal(refused.status, "failed");
  assert.match(refused.lastError ?? "", /^PermanentError: the account was deleted/);
  assert.equal(summary.deadLettered, 2);
});

Deno.test("a job whose lease was lost is left to its new owner", async () => {
  const queue = new MemoryQueue();
  const job = queue.add("ok", { n: 1 });
  const events: LogEvent[] = [];
  const stealing: HandlerMap = {
    ok: defineHandler(z.object({}), () => {
      job.lock_token = crypto.randomUUID(); // the sweeper rescued it, another worker claimed it
    }),
  };

  const summary = await drain(
    ["default"],
    options(queue, { handlers: stealing, log: (event) => events.push(event) }),
  );

  assert.equal(job.status, "running");
  assert.equal(summary.stale, 1);
  assert.equal(summary.completed, 0);
  assert.ok(events.some((event) => event.event === "job.stale" && event.id === job.id));
});

Deno.test("claiming stops when the time budget is nearly spent", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 20; n++) queue.add("ok", { n });
  let clock = 0;
  queue.beforeClaim = () => {
    clock += 30; // each claim and its batch take 30 ms
  };

  const summary = await drain(
    ["default"],
    options(queue, { batchSize: 2, timeBudgetMs: 100, now: () => clock }),
  );

  // 30, 60, 90 ms: a fourth batch would end at 120 ms, past the budget.
  assert.equal(summary.stoppedBy, "time budget");
  assert.equal(queue.claims.length, 3);
  assert.equal(summary.completed, 6);
  assert.equal(queue.byStatus("queued").length, 14, "the rest waits for the next wake-up");
});

Deno.test("handlers still running when the budget ends are aborted and retried", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");

  const summary = await drain(["default"], options(queue, { timeBudgetMs: 50 }));

  assert.equal(slow.status, "queued");
  assert.match(slow.lastError ?? "", /TimeoutError/);
  assert.equal(summary.retried, 1);
});

Deno.test("a handler that ignores the abort is abandoned, and the batch goes on", async () => {
  const queue = new MemoryQueue();
  const stuck = queue.add("stuck");
  queue.add("ok", { n: 1 });
  const withStuck: HandlerMap = {
    ...handlers,
    stuck: defineHandler(z.object({}), () => new Promise<void>(() => {})),
  };

  const summary = await drain(
    ["default"],
    options(queue, { handlers: withStuck, timeBudgetMs: 50 }),
  );

  assert.equal(stuck.status, "queued");
  assert.match(stuck.lastError ?? "", /^TimeoutError: the job was still running after \d+ ms/);
  assert.deepEqual(queue.byStatus("done"), [2]);
  assert.equal(summary.retried, 1);
});

Deno.test("handlers are stopped before the lease their row was given runs out", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  // The database's configured lease: 2.05 s leaves 50 ms once the 2 s kept for reporting are
  // taken off.
  queue.leaseSeconds = 2.05;
  const started = performance.now();

  await drain(["default"], options(queue));

  assert.equal(slow.status, "queued");
  assert.match(slow.lastError ?? "", /^TimeoutError: the job was still running after \d+ ms/);
  assert.ok(performance.now() - started < 1000);
});

Deno.test("a lease set for the worker is asked for, and limits the handlers", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const started = performance.now();

  await drain(["default"], options(queue, { leaseSeconds: 2.05 }));

  assert.equal(queue.claims[0].leaseSeconds, 2.05);
  assert.equal(slow.status, "queued");
  assert.ok(performance.now() - started < 1000);
});

Deno.test("claimed rows without their lease times end the drain with an error that says why", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const claim = queue.claim.bind(queue);
  queue.claim = async (claimOptions) =>
    (await claim(claimOptions)).map((job) => ({ ...job, locked_at: "", locked_until: "" }));

  const summary = await drain(["default"], options(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /job 1 without locked_at and locked_until/);
});

Deno.test("each woken queue is drained, in turn", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 4; n++) queue.add("ok", { n }, { queue: "emails" });
  for (let n = 5; n <= 8; n++) queue.add("ok", { n }, { queue: "webhooks" });
  queue.add("ok", { n: 9 }, { queue: "elsewhere" });

  await drain(["emails", "webhooks"], options(queue));

  assert.deepEqual(queue.byStatus("done"), [1, 2, 3, 4, 5, 6, 7, 8]);
  assert.deepEqual(
    queue.claims.map((claim) => claim.queue),
    ["emails", "webhooks", "emails", "webhooks"],
  );
});

Deno.test("an error from the API ends the drain and is reported", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  queue.beforeClaim = () => {
    throw new Error("connection refused");
  };

  const summary = await drain(["default"], options(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /connection refused/);
});
