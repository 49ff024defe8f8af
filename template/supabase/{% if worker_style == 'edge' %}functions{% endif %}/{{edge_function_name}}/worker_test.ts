import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, type HandlerMap, PermanentError } from "./job.ts";
import { FakeClock, MemoryQueue } from "./testing.ts";
import {
  type Drain,
  type DrainOptions,
  type DrainSummary,
  type LogEvent,
  startDrain,
} from "./worker.ts";

/** The `ok` kind: records each job's `n` in `ran`. */
function recordingOk(ran: number[]) {
  return defineHandler(z.object({ n: z.number() }), ({ n }) => {
    ran.push(n);
  });
}

const handlers: HandlerMap = {
  ok: recordingOk([]),
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
    wallClockLimitMs: 150_000,
    lingerPollMs: 100,
    log: () => {},
    ...overrides,
  };
}

/** A drain of `queues` from start to end. */
function drain(queues: readonly string[], options: DrainOptions): Promise<DrainSummary> {
  return startDrain(queues, options).done;
}

Deno.test("every job runs once and is completed, a batch at a time", async () => {
  const ran: number[] = [];
  const queue = new MemoryQueue();
  for (let n = 1; n <= 7; n++) queue.add("ok", { n });
  queue.add("not_ours");

  const summary = await drain(
    ["default"],
    options(queue, { handlers: { ...handlers, ok: recordingOk(ran) } }),
  );

  assert.deepEqual(ran.sort((a, b) => a - b), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(queue.byStatus("done"), [1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(queue.byStatus("queued"), [8], "kinds without a handler are not claimed");
  assert.equal(summary.claimed, 7);
  assert.equal(summary.completed, 7);
  assert.equal(summary.stoppedBy, "empty");
  assert.deepEqual(queue.claims[0].kinds.sort(), ["boom", "ok", "refused", "slow"]);
  assert.equal(queue.claims[0].worker, "test-worker");
  assert.equal(queue.claims[0].leaseSeconds, undefined, "the database's lease applies");
});

Deno.test("each claim completes the batch before it, in the same call", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 7; n++) queue.add("ok", { n });

  const summary = await drain(["default"], options(queue));

  // The short last batch is reported at once, by a claim that finds the queue empty.
  assert.deepEqual(queue.calls.map(({ done, maxJobs }) => [done, maxJobs]), [
    [[], 3],
    [[1, 2, 3], 3],
    [[4, 5, 6], 3],
    [[7], 3],
  ]);
  assert.equal(summary.completed, 7);
});

Deno.test("a failing job never stops the batch, and its error is stored", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const boom = queue.add("boom");
  queue.add("ok", { n: 2 });

  const summary = await drain(["default"], options(queue, { batchSize: 10 }));

  assert.deepEqual(queue.byStatus("done"), [1, 3]);
  assert.deepEqual(queue.calls.flatMap((call) => call.done), [1, 3], "failures go to fail()");
  assert.equal(boom.status, "queued", "a plain error is retried");
  assert.match(boom.lastError ?? "", /^Error: the upstream API is down\n\s+at /);
  assert.equal(summary.retried, 1);
  assert.equal(summary.completed, 2);
});

Deno.test("retries end in the dead letters once attempts are used up", async () => {
  const queue = new MemoryQueue();
  const boom = queue.add("boom", {}, { maxAttempts: 2 });
  queue.backoffMs = 0; // the second wake-up finds it at once

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
  const failing = queue.add("boom");
  const events: LogEvent[] = [];
  const newTokens: string[] = [];
  const steal = () => {
    // The sweeper rescued the job and another worker claimed it.
    const token = crypto.randomUUID();
    queue.jobs[newTokens.length].lock_token = token;
    newTokens.push(token);
  };
  const stealing: HandlerMap = {
    ok: defineHandler(z.object({}), steal),
    boom: defineHandler(z.object({}), () => {
      steal();
      throw new Error("too late anyway");
    }),
  };

  const summary = await drain(
    ["default"],
    options(queue, { handlers: stealing, log: (event) => events.push(event) }),
  );

  assert.deepEqual([job.status, job.lock_token], ["running", newTokens[0]]);
  assert.deepEqual([failing.status, failing.lock_token], ["running", newTokens[1]]);
  assert.deepEqual(queue.calls[1].done, [job.id], "its completion was sent, and ignored");
  assert.equal(summary.stale, 1, "fail() says when the lease was lost");
  assert.ok(events.some((event) => event.event === "job.stale" && event.id === failing.id));
});

Deno.test("claiming stops when the time budget is nearly spent", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 20; n++) queue.add("ok", { n });
  const clock = new FakeClock();
  queue.beforeCall = () => clock.advance(30); // each claim and its batch take 30 ms

  const summary = await drain(
    ["default"],
    options(queue, { batchSize: 2, timeBudgetMs: 100, clock }),
  );

  // 30, 60, 90 ms: a fourth batch would end at 120 ms, past the budget.
  assert.equal(summary.stoppedBy, "time budget");
  assert.equal(queue.claims.length, 3);
  // The last batch had no claim to ride on: its completions went on their own, before the
  // drain ended.
  assert.deepEqual(queue.calls.at(-1), { ...queue.calls[0], done: [5, 6], maxJobs: 0 });
  assert.deepEqual(queue.byStatus("done"), [1, 2, 3, 4, 5, 6]);
  assert.equal(summary.completed, 6);
  assert.equal(queue.byStatus("queued").length, 14, "the rest waits for the next wake-up");
});

Deno.test("completions a failed call carried are sent again before the drain ends", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 5; n++) queue.add("ok", { n });
  queue.beforeCall = () => {
    if (queue.calls.length === 2) throw new Error("502 Bad Gateway");
  };

  const summary = await drain(["default"], options(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /502 Bad Gateway/);
  assert.deepEqual(queue.calls.map(({ done, maxJobs }) => [done, maxJobs]), [
    [[], 3],
    [[1, 2, 3], 3],
    [[1, 2, 3], 0],
  ]);
  assert.deepEqual(queue.byStatus("done"), [1, 2, 3]);
  assert.equal(summary.completed, 3);
  assert.equal(summary.unreported, 0);
});

Deno.test("completions that cannot be sent are counted and logged, with their jobs", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 2; n++) queue.add("ok", { n });
  queue.beforeCall = (call) => {
    if (call.done.length > 0) throw new Error("connection reset");
  };
  const events: LogEvent[] = [];

  const summary = await drain(["default"], options(queue, { log: (e) => events.push(e) }));

  assert.deepEqual(queue.byStatus("running"), [1, 2], "the sweeper rescues them");
  assert.equal(summary.completed, 0);
  assert.equal(summary.unreported, 2);
  assert.ok(events.some((e) =>
    e.event === "queue.error" && e.call === "complete_and_claim" &&
    JSON.stringify(e.jobs) === "[1,2]"
  ));
});

Deno.test("a handler that ignores the abort is abandoned, and the batch goes on", async () => {
  const queue = new MemoryQueue();
  const stuck = queue.add("stuck");
  queue.add("ok", { n: 1 });
  const withStuck: HandlerMap = {
    ...handlers,
    stuck: defineHandler(z.object({}), () => new Promise<void>(() => {})),
  };
  // The database's configured lease: 10 s leaves 8 s once the 2 s kept for reporting are
  // taken off.
  queue.leaseSeconds = 10;
  const clock = new FakeClock();
  const running = startDrain(["default"], options(queue, { handlers: withStuck, clock }));
  await settle();

  clock.advance(8000);
  const summary = await settledOrFail(running.done, "the stuck handler held the batch");

  assert.equal(stuck.status, "queued");
  assert.match(stuck.lastError ?? "", /^TimeoutError: the job was still running after 8000 ms/);
  assert.deepEqual(queue.byStatus("done"), [2]);
  assert.equal(summary.retried, 1);
});

Deno.test("handlers are stopped before the lease their row was given runs out", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  queue.leaseSeconds = 10; // the database's configured lease
  const clock = new FakeClock();
  const running = startDrain(["default"], options(queue, { clock }));
  await settle();

  // 2 s before the lease ends, to report the job in time.
  clock.advance(7999);
  await settle();
  assert.equal(slow.status, "running");
  clock.advance(1);
  await settledOrFail(running.done, "the handler outlived its lease");

  assert.equal(slow.status, "queued");
  assert.equal(slow.attempts, 1, "a job longer than its lease spends its attempt");
  assert.match(slow.lastError ?? "", /^TimeoutError: the job was still running after 8000 ms/);
});

Deno.test("a lease set for the worker is asked for, and limits the handlers", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const clock = new FakeClock();
  const running = startDrain(["default"], options(queue, { clock, leaseSeconds: 11 }));
  await settle();

  clock.advance(9000); // inside the 10 s budget
  await settledOrFail(running.done, "the handler outlived the worker's lease");

  assert.equal(queue.claims[0].leaseSeconds, 11);
  assert.equal(slow.status, "queued");
  assert.match(slow.lastError ?? "", /after 9000 ms/);
});

Deno.test("claimed rows without their lease times end the drain with an error that says why", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const completeAndClaim = queue.completeAndClaim.bind(queue);
  queue.completeAndClaim = async (callOptions) =>
    (await completeAndClaim(callOptions)).map((job) => ({
      ...job,
      locked_at: "",
      locked_until: "",
    }));

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
  // Full batches, short ones, then the claims that report the last jobs and find none.
  assert.deepEqual(
    queue.claims.map((claim) => claim.queue),
    ["emails", "webhooks", "emails", "webhooks", "emails", "webhooks"],
  );
});

Deno.test("an error from the API ends the drain and is reported", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  queue.beforeCall = () => {
    throw new Error("connection refused");
  };

  const summary = await drain(["default"], options(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /connection refused/);
});

Deno.test("after the queues run dry, the drain lingers and runs jobs that come late", async () => {
  const ran: number[] = [];
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const clock = new FakeClock();
  clock.at(300, () => queue.add("ok", { n: 2 }));
  clock.at(1900, () => queue.add("ok", { n: 3 }));

  const summary = await drain(
    ["default"],
    options(queue, {
      handlers: { ...handlers, ok: recordingOk(ran) },
      lingerMs: 2000,
      lingerPollMs: 100,
      clock,
    }),
  );

  assert.deepEqual(ran, [1, 2, 3]);
  assert.equal(summary.completed, 3);
  assert.equal(summary.stoppedBy, "empty");
  // A claim every 100 ms, and one more at once after each job, to report it; the jobs found
  // at 300 and 1,900 ms each started the window over, and it ended 2 s after the last one.
  assert.equal(summary.elapsedMs, 3900);
  assert.equal(queue.claims.length, 40 + 3);
  assert.deepEqual(queue.calls.filter((call) => call.done.length > 0).map((call) => call.done), [
    [1],
    [2],
    [3],
  ]);
});

Deno.test("without a linger, the drain stops at the first claim that finds nothing", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const clock = new FakeClock();

  const summary = await drain(
    ["default"],
    options(queue, { lingerMs: 0, clock }),
  );

  assert.equal(summary.stoppedBy, "empty");
  assert.equal(summary.completed, 1);
  assert.equal(summary.elapsedMs, 0, "it never paused");
  // The second claim reported the job and found nothing.
  assert.deepEqual(queue.calls.map(({ done, maxJobs }) => [done, maxJobs]), [[[], 3], [[1], 3]]);
});

Deno.test("the time budget ends a linger", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();

  const summary = await drain(
    ["default"],
    options(queue, {
      timeBudgetMs: 1000,
      lingerMs: 5000,
      lingerPollMs: 100,
      clock,
    }),
  );

  // Claims at 0, 100, ..., 900 ms; one more pause would reach the end of the budget.
  assert.equal(summary.stoppedBy, "time budget");
  assert.equal(summary.elapsedMs, 900);
  assert.equal(queue.claims.length, 10);
});

Deno.test("a lingering drain polls every woken queue", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  clock.at(500, () => queue.add("ok", { n: 1 }, { queue: "webhooks" }));

  const summary = await drain(
    ["emails", "webhooks"],
    options(queue, { lingerMs: 1000, lingerPollMs: 250, clock }),
  );

  assert.deepEqual(queue.byStatus("done"), [1]);
  assert.equal(summary.stoppedBy, "empty");
  assert.equal(summary.elapsedMs, 1500);
  // Both queues at 0, 250, ..., 1,500 ms, and webhooks once more at 500 ms to report its job.
  const round = ["emails", "webhooks"];
  assert.deepEqual(
    queue.claims.map((claim) => claim.queue),
    [...round, ...round, ...round, "webhooks", ...round, ...round, ...round, ...round],
  );
});

Deno.test("a wake-up joins a lingering drain, which starts its window over", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  const joins: boolean[] = [];
  const running = startDrain(
    ["default"],
    options(queue, { lingerMs: 1000, lingerPollMs: 100, clock }),
  );
  clock.at(800, () => joins.push(running.join(["default"])));
  // Past the first window (which ended at 1,000 ms), inside the one the join started.
  clock.at(1700, () => queue.add("ok", { n: 1 }));

  const summary = await running.done;

  assert.deepEqual(joins, [true]);
  assert.equal(summary.wakeUps, 2);
  assert.equal(summary.completed, 1);
  assert.equal(summary.elapsedMs, 2700);
  assert.equal(running.join(["default"]), false, "a drain that stopped takes no more wake-ups");
});

Deno.test("a wake-up that joins cuts the drain's pause short", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  let pausing: () => void = () => {};
  const paused = new Promise<void>((resolve) => pausing = resolve);
  let pauses = 0;
  // The first pause lasts until something cuts it short; the others pass at once.
  const sleep = (ms: number, signal: AbortSignal): Promise<void> => {
    pauses += 1;
    if (pauses > 1) return clock.sleep(ms);
    pausing();
    return new Promise((resolve) => signal.addEventListener("abort", () => resolve()));
  };
  const running = startDrain(
    ["default"],
    options(queue, { lingerMs: 1000, lingerPollMs: 100, clock: { ...clock, sleep } }),
  );
  await paused;

  queue.add("ok", { n: 1 });
  assert.equal(running.join(["default"]), true);
  const summary = await running.done;

  assert.equal(summary.completed, 1);
  assert.equal(summary.stoppedBy, "empty");
});

Deno.test("a drain takes wake-ups, busy or lingering, until it stops claiming", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  queue.add("ok", { n: 1 });
  const joins: boolean[] = [];
  const started: { drain?: Drain } = {};
  const tryJoin = (queues = ["default"]) => {
    joins.push(started.drain?.join(queues) ?? false);
  };
  const joiningHandlers: HandlerMap = { ok: defineHandler(z.object({}), () => tryJoin()) };
  const running = started.drain = startDrain(
    ["default"],
    options(queue, {
      handlers: joiningHandlers,
      timeBudgetMs: 10_000,
      lingerMs: 8000,
      lingerPollMs: 1000,
      clock,
    }),
  );
  // At 6 s, a wake-up for another queue too: the drain adds it.
  clock.at(6000, () => tryJoin(["default", "emails"]));

  const summary = await running.done;
  tryJoin();

  // While its job ran: yes. Lingering at 6 s: yes. Once it stopped: no.
  assert.deepEqual(joins, [true, true, false]);
  assert.equal(summary.wakeUps, 3);
  assert.deepEqual(running.queues, ["default", "emails"]);
  assert.deepEqual(queue.checkins.map(({ queue }) => queue), ["default", "emails"]);
  assert.equal(summary.stoppedBy, "time budget");
});

Deno.test("a drain checks in with its kinds for each queue it was woken for", async () => {
  const queue = new MemoryQueue();
  await drain(["default", "mail"], options(queue));
  assert.deepEqual(
    queue.checkins.map(({ worker, queue, kinds }) => [worker, queue, kinds.sort()]),
    [
      ["test-worker", "default", ["boom", "ok", "refused", "slow"]],
      ["test-worker", "mail", ["boom", "ok", "refused", "slow"]],
    ],
  );
});

Deno.test("a failed check-in is logged and the jobs still run", async () => {
  const queue = new MemoryQueue();
  queue.checkin = () => Promise.reject(new Error("checkin() does not exist yet"));
  queue.add("ok", { n: 1 });
  const events: LogEvent[] = [];

  const summary = await drain(["default"], options(queue, { log: (e) => events.push(e) }));

  assert.equal(summary.completed, 1);
  assert.ok(events.some((e) => e.event === "queue.error" && e.call === "checkin"));
});

// -- results and progress ---------------------------------------------------------------

const returning: HandlerMap = {
  echo: defineHandler(z.object({ result: z.json().optional() }), ({ result }) => result),
  big: defineHandler(z.object({ bytes: z.number() }), ({ bytes }) => "x".repeat(bytes - 2)),
  bigint: defineHandler(z.object({}), () => ({ total: 10n })),
  cycle: defineHandler(z.object({}), () => {
    const node: Record<string, unknown> = {};
    node.self = node;
    return node;
  }),
  callback: defineHandler(z.object({}), () => () => "a function"),
};

Deno.test("what a handler returns is its job's result, sent with the next claim", async () => {
  const queue = new MemoryQueue();
  const withObject = queue.add("echo", { result: { rows: 12, ok: true } });
  const withString = queue.add("echo", { result: "sent" });
  const withNothing = queue.add("echo", {});
  const withNull = queue.add("echo", { result: null });

  const summary = await drain(["default"], options(queue, { handlers: returning, batchSize: 4 }));

  assert.equal(summary.completed, 4);
  assert.deepEqual(queue.calls.map(({ done }) => done), [[], [1, 2, 3, 4]]);
  assert.deepEqual(withObject.result, { rows: 12, ok: true });
  assert.equal(withString.result, "sent");
  assert.deepEqual([withNothing.result, withNull.result], [null, null], "no result: none");
  assert.deepEqual(queue.byStatus("done"), [1, 2, 3, 4]);
});

Deno.test("results ride along with the completions sent on their own at the end", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 4; n++) queue.add("echo", { result: { n } });
  const clock = new FakeClock();
  queue.beforeCall = () => clock.advance(30);

  await drain(
    ["default"],
    options(queue, { handlers: returning, batchSize: 2, timeBudgetMs: 70, clock }),
  );

  assert.deepEqual(queue.calls.at(-1)?.maxJobs, 0);
  assert.deepEqual(queue.calls.at(-1)?.done, [3, 4]);
  assert.deepEqual(queue.jobs.map((job) => job.result), [{ n: 1 }, { n: 2 }, { n: 3 }, { n: 4 }]);
});

Deno.test("a result over max_result_bytes fails its job for good, and the batch goes on", async () => {
  const queue = new MemoryQueue();
  queue.resultLimit = 1000;
  const before = queue.add("echo", { result: 1 });
  const tooBig = queue.add("big", { bytes: 1001 });
  const justFits = queue.add("big", { bytes: 1000 });
  const after = queue.add("echo", {});

  const summary = await drain(["default"], options(queue, { handlers: returning, batchSize: 10 }));

  assert.equal(tooBig.status, "failed", "not retried: it would return the same");
  assert.equal(
    tooBig.lastError,
    "ResultError: the handler's result is 1001 bytes of JSON; the limit is 1000 " +
      "(max_result_bytes): return less, or store it elsewhere (e.g. Supabase Storage) and " +
      "return a reference",
  );
  assert.equal(tooBig.result, null);
  assert.deepEqual(queue.byStatus("done"), [before.id, justFits.id, after.id]);
  assert.equal((justFits.result as string).length, 998);
  assert.deepEqual([summary.completed, summary.deadLettered], [3, 1]);
});

Deno.test("the size is counted in UTF-8 bytes of JSON", async () => {
  const queue = new MemoryQueue();
  queue.resultLimit = 10;
  // "éééé" is 6 characters of JSON with its quotes, and 10 bytes; "ééééé" is 12 bytes.
  const fits = queue.add("echo", { result: "éééé" });
  const over = queue.add("echo", { result: "ééééé" });

  await drain(["default"], options(queue, { handlers: returning }));

  assert.equal(fits.status, "done");
  assert.equal(over.status, "failed");
  assert.match(over.lastError ?? "", /is 12 bytes of JSON; the limit is 10 /);
});

Deno.test("a result that is not JSON fails its job, saying why", async () => {
  const queue = new MemoryQueue();
  const bigint = queue.add("bigint");
  const cycle = queue.add("cycle");
  const callback = queue.add("callback");
  const fine = queue.add("echo", { result: [1, 2] });

  await drain(["default"], options(queue, { handlers: returning, batchSize: 10 }));

  assert.deepEqual(queue.byStatus("failed"), [bigint.id, cycle.id, callback.id]);
  assert.match(bigint.lastError ?? "", /^ResultError: the handler's result is not JSON: .*BigInt/);
  assert.match(cycle.lastError ?? "", /^ResultError: the handler's result is not JSON: .*circular/);
  assert.equal(callback.lastError, "ResultError: the handler's result is not JSON: a function");
  assert.deepEqual(fine.result, [1, 2]);
});

Deno.test("a result the database refuses is completed alone, then failed; the rest complete", async () => {
  const queue = new MemoryQueue();
  // As jsonb, an array of small numbers is several times its JSON text.
  queue.storedBytes = (result) => Array.isArray(result) ? 12 * result.length : 10;
  const plain = queue.add("echo", {});
  const refused = queue.add("echo", { result: new Array(6000).fill(0) });
  const small = queue.add("echo", { result: { ok: true } });
  queue.add("echo", {});
  const events: LogEvent[] = [];

  const summary = await drain(
    ["default"],
    options(queue, { handlers: returning, batchSize: 3, log: (event) => events.push(event) }),
  );

  assert.equal(refused.status, "failed");
  assert.equal(
    refused.lastError,
    "ResultError: the database refused the handler's result: the result of job 2 is 72000 " +
      "bytes; the limit is 65536 (max_result_bytes)",
  );
  assert.deepEqual(queue.byStatus("done"), [1, 3, 4]);
  assert.deepEqual(small.result, { ok: true });
  assert.equal(plain.result, null);
  // The refused call changed nothing; the job with a result that fits was completed alone,
  // and the claim was sent again with the job without one.
  assert.deepEqual(queue.calls.map(({ done }) => done), [[], [1, 2, 3], [1], [4]]);
  assert.deepEqual([summary.completed, summary.deadLettered, summary.unreported], [3, 1, 0]);
  assert.ok(events.some((event) => event.event === "job.failed" && event.id === refused.id));
});

Deno.test("the size limit is read once a drain, when the first result comes", async () => {
  const queue = new MemoryQueue();
  let reads = 0;
  const read = queue.maxResultBytes.bind(queue);
  queue.maxResultBytes = () => {
    reads += 1;
    return read();
  };
  for (let n = 1; n <= 3; n++) queue.add("echo", {});

  await drain(["default"], options(queue, { handlers: returning }));
  assert.equal(reads, 0, "jobs without results need no limit");

  for (let n = 1; n <= 5; n++) queue.add("echo", { result: n });
  await drain(["default"], options(queue, { handlers: returning, batchSize: 2 }));
  assert.equal(reads, 1);
});

Deno.test("when the limit cannot be read, 65536 bytes applies and the failure is logged", async () => {
  const queue = new MemoryQueue();
  queue.resultLimit = undefined;
  const fits = queue.add("big", { bytes: 65536 });
  const over = queue.add("big", { bytes: 65537 });
  const events: LogEvent[] = [];

  await drain(["default"], options(queue, { handlers: returning, log: (e) => events.push(e) }));

  assert.equal(fits.status, "done");
  assert.equal(over.status, "failed");
  assert.match(over.lastError ?? "", /is 65537 bytes of JSON; the limit is 65536 /);
  const logged = events.filter((e) => e.event === "queue.error" && e.call === "config");
  assert.equal(logged.length, 1);
  assert.match(String(logged[0].error), /permission denied for table config/);
});

Deno.test("a handler reports progress with its attempt's lock token", async () => {
  const queue = new MemoryQueue();
  const job = queue.add("report", {}, { concurrencyKey: "tenant-7" });
  const seen: unknown[] = [];
  const reporting: HandlerMap = {
    report: defineHandler(z.object({}), async (_payload, { job: running, reportProgress }) => {
      seen.push(running.concurrencyKey);
      seen.push(await reportProgress({ done: 1, of: 2 }));
      seen.push(queue.jobs[0].progress);
      // The sweeper rescued the job and another worker claimed it.
      queue.jobs[0].lock_token = crypto.randomUUID();
      seen.push(await reportProgress({ done: 2, of: 2 }));
      seen.push(queue.jobs[0].progress);
    }),
  };

  await drain(["default"], options(queue, { handlers: reporting }));

  assert.deepEqual(seen, ["tenant-7", true, { done: 1, of: 2 }, false, { done: 1, of: 2 }]);
  assert.equal(job.status, "running", "left to its new owner");
});

// -- the isolate's limits -------------------------------------------------------------------

/** Lets the drain's pending promises run (no time passes on the test's clock). */
async function settle(): Promise<void> {
  for (let turn = 0; turn < 20; turn++) await new Promise((resolve) => setTimeout(resolve, 0));
}

/** `done`, or a failure naming `what` if it has not settled once the event loop is idle. */
async function settledOrFail<T>(done: Promise<T>, what: string): Promise<T> {
  let settledValue: { value: T } | undefined;
  done.then((value) => settledValue = { value });
  await settle();
  if (settledValue === undefined) throw new assert.AssertionError({ message: what });
  return settledValue.value;
}

Deno.test("a late wake-up in an old isolate stops at the isolate's deadline, releasing its job", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const clock = new FakeClock();
  // The isolate started at 0 and has served wake-ups for 100 s of its 150 s; this one's
  // budget (100 s) would outlast it.
  clock.time = 100_000;
  const running = startDrain(
    ["default"],
    options(queue, {
      clock,
      isolateStartedAt: 0,
      wallClockLimitMs: 150_000,
      timeBudgetMs: 100_000,
    }),
  );
  await settle();
  assert.equal(slow.status, "running");

  // 150 s less the margin (a tenth) kept to report what is in hand.
  clock.advance(34_999);
  await settle();
  assert.equal(slow.status, "running");
  clock.advance(1);
  const summary = await settledOrFail(running.done, "the drain outlived the isolate's deadline");

  assert.equal(summary.stoppedBy, "wall-clock limit");
  assert.equal(slow.status, "queued", "the job is released, not failed");
  assert.equal(slow.attempts, 0, "no attempt spent");
  assert.equal(slow.lastError, null);
  assert.equal(summary.released, 1);
  assert.equal(summary.retried, 0);
});

Deno.test("a job cut off by the time budget is released, its attempt not counted", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  queue.add("ok", { n: 1 });
  const clock = new FakeClock();
  const running = startDrain(["default"], options(queue, { clock, timeBudgetMs: 5_000 }));
  await settle();

  clock.advance(5_000);
  const summary = await settledOrFail(running.done, "the drain outlived its budget");

  assert.equal(summary.stoppedBy, "time budget");
  assert.deepEqual([slow.status, slow.attempts, slow.lastError], ["queued", 0, null]);
  assert.deepEqual(queue.byStatus("done"), [2], "what ran to the end is still completed");
  assert.deepEqual(queue.calls.at(-1)?.done, [2]);
  assert.deepEqual([summary.released, summary.completed], [1, 1]);
});

Deno.test("a Data API call that hangs times out, before the time left runs out", async () => {
  for (const [startAt, cutAfter] of [[0, 10_000], [130_000, 5_000]]) {
    const queue = new MemoryQueue();
    queue.add("ok", { n: 1 });
    const clock = new FakeClock();
    clock.time = startAt;
    const signals: (AbortSignal | undefined)[] = [];
    // The Data API never answers, until the call's signal gives up on it.
    queue.completeAndClaim = ({ signal }) => {
      signals.push(signal);
      return new Promise((_resolve, reject) => {
        signal?.addEventListener("abort", () => reject(signal.reason));
      });
    };
    const running = startDrain(
      ["default"],
      options(queue, {
        clock,
        isolateStartedAt: 0,
        wallClockLimitMs: 150_000,
        timeBudgetMs: 100_000,
        callTimeoutMs: 10_000,
      }),
    );
    await settle();
    assert.equal(signals.length, 1);
    assert.ok(signals[0] instanceof AbortSignal, "the call was given a signal");

    // 10 s for a call, or less when the drain has less left (135 s into the isolate).
    clock.advance(cutAfter - 1);
    assert.equal(signals[0].aborted, false);
    clock.advance(1);
    assert.equal(signals[0].aborted, true, `a call at ${startAt} ms is cut after ${cutAfter}`);
    const summary = await settledOrFail(running.done, "the drain waited on a hung call");
    assert.equal(summary.stoppedBy, "error");
    assert.match(summary.error ?? "", /timed out/);
  }
});

Deno.test("a claim's lease never outlasts the isolate", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 6; n++) queue.add("ok", { n });
  queue.leaseSeconds = 300; // the database's
  const clock = new FakeClock();
  clock.time = 100_000; // 50 s left of a 150 s isolate
  queue.beforeCall = () => clock.advance(1000);

  await drain(
    ["default"],
    options(queue, { clock, isolateStartedAt: 0, wallClockLimitMs: 150_000 }),
  );
  const asked = queue.claims.map((claim) => claim.leaseSeconds);

  // The first claim learns the database's lease; the next ones ask for what is left.
  assert.deepEqual(asked, [undefined, 49, 48]);

  const own = new MemoryQueue();
  own.add("ok", { n: 1 });
  clock.time = 100_000;
  await drain(
    ["default"],
    options(own, { clock, isolateStartedAt: 0, wallClockLimitMs: 150_000, leaseSeconds: 600 }),
  );
  assert.deepEqual(own.claims.map((claim) => claim.leaseSeconds), [50, 50]);
});
