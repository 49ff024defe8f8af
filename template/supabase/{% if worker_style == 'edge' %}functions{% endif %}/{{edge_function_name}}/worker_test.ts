// The drain (worker.ts): claims and batches, handlers' time limits, leases, deadlines. Its
// linger and the wake-ups that join it: worker_linger_test.ts; how jobs' ends are reported:
// report_test.ts.
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, type HandlerMap } from "./job.ts";
import {
  drain,
  drainHandlers,
  drainOptions,
  FakeClock,
  MemoryQueue,
  recordingOk,
  settle,
  settledOrFail,
} from "./testing.ts";
import { startDrain } from "./worker.ts";

Deno.test("every job runs once and is completed, a batch at a time", async () => {
  const ran: number[] = [];
  const queue = new MemoryQueue();
  for (let n = 1; n <= 7; n++) queue.add("ok", { n });
  queue.add("not_ours");

  const summary = await drain(
    ["default"],
    drainOptions(queue, { handlers: { ...drainHandlers, ok: recordingOk(ran) } }),
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

  const summary = await drain(["default"], drainOptions(queue));

  // The short last batch is reported at once, by a claim that finds the queue empty.
  assert.deepEqual(queue.calls.map(({ done, maxJobs }) => [done, maxJobs]), [
    [[], 3],
    [[1, 2, 3], 3],
    [[4, 5, 6], 3],
    [[7], 3],
  ]);
  assert.equal(summary.completed, 7);
});

Deno.test("claiming stops when the time budget is nearly spent", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 20; n++) queue.add("ok", { n });
  const clock = new FakeClock();
  queue.beforeCall = () => clock.advance(30); // each claim and its batch take 30 ms

  const summary = await drain(
    ["default"],
    drainOptions(queue, { batchSize: 2, timeBudgetMs: 100, clock }),
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

Deno.test("a handler that ignores the abort is abandoned, and the batch goes on", async () => {
  const queue = new MemoryQueue();
  const stuck = queue.add("stuck");
  queue.add("ok", { n: 1 });
  const withStuck: HandlerMap = {
    ...drainHandlers,
    stuck: defineHandler(z.object({}), () => new Promise<void>(() => {})),
  };
  // The database's configured lease: 10 s leaves 8 s once the 2 s kept for reporting are
  // taken off.
  queue.leaseSeconds = 10;
  const clock = new FakeClock();
  const running = startDrain(["default"], drainOptions(queue, { handlers: withStuck, clock }));
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
  const running = startDrain(["default"], drainOptions(queue, { clock }));
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
  const running = startDrain(["default"], drainOptions(queue, { clock, leaseSeconds: 11 }));
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

  const summary = await drain(["default"], drainOptions(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /job 1 without locked_at and locked_until/);
});

Deno.test("each woken queue is drained, in turn", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 4; n++) queue.add("ok", { n }, { queue: "emails" });
  for (let n = 5; n <= 8; n++) queue.add("ok", { n }, { queue: "webhooks" });
  queue.add("ok", { n: 9 }, { queue: "elsewhere" });

  await drain(["emails", "webhooks"], drainOptions(queue));

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

  const summary = await drain(["default"], drainOptions(queue));

  assert.equal(summary.stoppedBy, "error");
  assert.match(summary.error ?? "", /connection refused/);
});

// -- the isolate's limits -------------------------------------------------------------------

Deno.test("a late wake-up in an old isolate stops at the isolate's deadline, releasing its job", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const clock = new FakeClock();
  // The isolate started at 0 and has served wake-ups for 100 s of its 150 s; this one's
  // budget (100 s) would outlast it.
  clock.time = 100_000;
  const running = startDrain(
    ["default"],
    drainOptions(queue, {
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
  const running = startDrain(["default"], drainOptions(queue, { clock, timeBudgetMs: 5_000 }));
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
      drainOptions(queue, {
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
    drainOptions(queue, { clock, isolateStartedAt: 0, wallClockLimitMs: 150_000 }),
  );
  const asked = queue.claims.map((claim) => claim.leaseSeconds);

  // The first claim learns the database's lease; the next ones ask for what is left.
  assert.deepEqual(asked, [undefined, 49, 48]);

  const own = new MemoryQueue();
  own.add("ok", { n: 1 });
  clock.time = 100_000;
  await drain(
    ["default"],
    drainOptions(own, { clock, isolateStartedAt: 0, wallClockLimitMs: 150_000, leaseSeconds: 600 }),
  );
  assert.deepEqual(own.claims.map((claim) => claim.leaseSeconds), [50, 50]);
});
