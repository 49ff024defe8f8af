// The drain (worker.ts): its pool of slots, claims, leases and their renewal, deadlines. Its
// linger and the wake-ups that join it: worker_linger_test.ts; its CPU budget and its logs:
// worker_cpu_test.ts; how jobs' ends are reported: report_test.ts.
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

Deno.test("every job runs once and is completed", async () => {
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
  assert.deepEqual(queue.claims[0].maxJobs, 3, "as many as there are slots");
  // Every completion rode along with a claim.
  assert.deepEqual(queue.calls.flatMap(({ done }) => done).sort(), [1, 2, 3, 4, 5, 6, 7]);
  assert.ok(queue.calls.every(({ maxJobs }) => maxJobs > 0));
});

Deno.test("a job that ends frees its slot at once, and the next claim fills it", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  for (let n = 1; n <= 4; n++) queue.add("ok", { n });
  const clock = new FakeClock();
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock, batchSize: 2, maxJobsInFlight: 2, timeBudgetMs: 5_000 }),
  );
  await settle();

  // No time passed: the slow job holds one slot, the other ran the four quick ones in turn,
  // each claim completing the one before.
  assert.equal(slow.status, "running");
  assert.deepEqual(queue.byStatus("done"), [2, 3, 4, 5]);
  assert.deepEqual(queue.calls.slice(0, 5).map(({ done, maxJobs }) => [done, maxJobs]), [
    [[], 2],
    [[2], 1],
    [[3], 1],
    [[4], 1],
    [[5], 1],
  ]);

  clock.advance(5_000);
  const summary = await settledOrFail(running.done, "the drain outlived its budget");
  assert.equal(summary.stoppedBy, "time budget");
  assert.deepEqual([slow.status, slow.attempts], ["queued", 0], "released at the deadline");
  assert.deepEqual([summary.completed, summary.released], [4, 1]);
});

Deno.test("jobs that end together are refilled by one call; a lone free slot waits 20 ms", async () => {
  const queue = new MemoryQueue();
  const slow = [queue.add("slow"), queue.add("slow"), queue.add("slow")];
  queue.add("ok", { n: 1 });
  queue.add("ok", { n: 2 });
  const clock = new FakeClock();
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock, batchSize: 4, maxJobsInFlight: 4 }),
  );
  await settle();

  // One slot of four is free: the claim waits for a second, or 20 ms.
  assert.deepEqual(queue.calls.map(({ done, maxJobs }) => [done, maxJobs]), [[[], 4]]);
  clock.advance(19);
  await settle();
  assert.equal(queue.calls.length, 1);
  clock.advance(1);
  await settle();
  assert.deepEqual(queue.calls[1], { ...queue.calls[0], done: [4], maxJobs: 1 });
  assert.deepEqual(queue.byStatus("done"), [4], "job 5, claimed then, is reported by the next");

  running.unload();
  const summary = await settledOrFail(running.done, "the drain did not stop");
  assert.deepEqual(slow.map((job) => job.status), ["queued", "queued", "queued"]);
  assert.equal(summary.released, 3);
});

Deno.test("a handler that ignores the abort is abandoned at the deadline, and released", async () => {
  const queue = new MemoryQueue();
  const stuck = queue.add("stuck");
  queue.add("ok", { n: 1 });
  const withStuck: HandlerMap = {
    ...drainHandlers,
    stuck: defineHandler(z.object({}), () => new Promise<void>(() => {})),
  };
  const clock = new FakeClock();
  const running = startDrain(["default"], drainOptions(queue, { handlers: withStuck, clock }));
  await settle();
  assert.deepEqual(queue.byStatus("done"), [2], "the other slot went on");

  clock.advance(10_000); // the time budget
  const summary = await settledOrFail(running.done, "the stuck handler held the drain");

  assert.deepEqual([stuck.status, stuck.attempts, stuck.lastError], ["queued", 0, null]);
  assert.equal(summary.released, 1);
});

Deno.test("claiming stops when the time budget is nearly spent", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 20; n++) queue.add("ok", { n });
  const clock = new FakeClock();
  const claimedAt: number[] = [];
  queue.beforeCall = ({ maxJobs }) => {
    if (maxJobs > 0) claimedAt.push(clock.now());
    clock.advance(30); // each call takes 30 ms
  };

  const summary = await drain(
    ["default"],
    drainOptions(queue, { batchSize: 2, maxJobsInFlight: 2, timeBudgetMs: 100, clock }),
  );

  // A job takes 30 ms from its claim to its end: no claim starts within 30 ms of the budget's
  // end, and every job claimed ran to the end.
  assert.equal(summary.stoppedBy, "time budget");
  assert.ok(claimedAt.every((at) => at + 30 < 100), `claims at ${claimedAt}`);
  assert.equal(summary.completed, summary.claimed);
  assert.deepEqual(queue.byStatus("done").length, summary.claimed);
  assert.equal(queue.byStatus("queued").length, 20 - summary.claimed, "the rest waits");
  // The last jobs had no claim to ride on: their completions went on their own.
  assert.equal(queue.calls.at(-1)?.maxJobs, 0);
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
  assert.deepEqual(queue.claims.slice(0, 2).map((claim) => claim.queue), ["emails", "webhooks"]);
  assert.ok(queue.claims.every((claim) => claim.queue !== "elsewhere"));
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

// -- leases ---------------------------------------------------------------------------------

Deno.test("every claim asks for a short lease, never longer than the isolate has left", async () => {
  const cases = [
    // [the isolate's age at the drain's start, the worker's lease, the leases asked for]
    [0, undefined, [60, 60]],
    [0, 20, [20, 20]],
    // 50 s left of a 150 s isolate, 1 s a call: the first claim too.
    [100_000, undefined, [50, 49]],
  ] as const;
  for (const [age, leaseSeconds, asked] of cases) {
    const queue = new MemoryQueue();
    queue.add("ok", { n: 1 });
    queue.leaseSeconds = 300; // the database's: never asked for
    const clock = new FakeClock();
    clock.time = age;
    queue.beforeCall = () => clock.advance(1000);
    await drain(
      ["default"],
      drainOptions(queue, { clock, isolateStartedAt: 0, wallClockLimitMs: 150_000, leaseSeconds }),
    );
    assert.deepEqual(queue.leases, asked, `at ${age} ms with ${leaseSeconds}`);
  }
});

Deno.test("leases are renewed with heartbeat_many() while their jobs run", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const clock = new FakeClock();
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock, leaseSeconds: 30, timeBudgetMs: 100_000 }),
  );
  await settle();
  const claimedUntil = Date.parse(slow.locked_until);

  // A third of the lease: 10 s.
  clock.advance(9_999);
  await settle();
  assert.equal(queue.heartbeats.length, 0);
  clock.advance(1);
  await settle();
  assert.deepEqual(queue.heartbeats, [{ ids: [slow.id], leaseSeconds: 30 }]);
  assert.ok(Date.parse(slow.locked_until) >= claimedUntil, "renewed, never shortened");
  clock.advance(10_000);
  await settle();
  assert.equal(queue.heartbeats.length, 2);

  // Past the 30 s lease it was claimed with: still running, still its own.
  for (const _ of [1, 2]) {
    clock.advance(10_000);
    await settle();
  }
  assert.equal(slow.status, "running");
  running.unload();
  const summary = await settledOrFail(running.done, "the drain did not stop");
  assert.equal(summary.heartbeats, 4);
  assert.equal(summary.released, 1);
});

Deno.test("a job whose lease was lost is stopped at the next renewal, left to its new owner", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const clock = new FakeClock();
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock, leaseSeconds: 30, timeBudgetMs: 100_000 }),
  );
  await settle();

  // The sweeper took it back, and another worker claimed it.
  const theirs = crypto.randomUUID();
  Object.assign(slow, { status: "running", lock_token: theirs });
  clock.advance(10_000);
  await settle();

  running.unload();
  const summary = await settledOrFail(running.done, "the lost job held its slot");
  assert.equal(summary.stale, 1);
  assert.equal(summary.released, 0, "no call on a job that is not its own");
  assert.deepEqual([slow.status, slow.lock_token, slow.lastError], ["running", theirs, null]);
});

Deno.test("when renewals fail, a job is stopped before its lease runs out, and retried", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  queue.beforeHeartbeat = () => {
    throw new Error("503 Service Unavailable");
  };
  const clock = new FakeClock();
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock, leaseSeconds: 30, timeBudgetMs: 100_000 }),
  );
  await settle();

  // At 10 s its lease has 20 s left: another renewal may come in time. At 20 s, it has 10 s
  // and the next renewal would come too late (less the 2 s kept to report it).
  clock.advance(10_000);
  await settle();
  assert.equal(slow.status, "running");
  clock.advance(10_000);
  await settle();
  running.unload();
  const summary = await settledOrFail(running.done, "the drain did not stop");

  assert.equal(slow.status, "queued");
  assert.equal(slow.attempts, 1, "its attempt counts: it failed");
  assert.match(slow.lastError ?? "", /^TimeoutError: the job's lease could not be renewed/);
  assert.match(slow.lastError ?? "", /503 Service Unavailable/);
  assert.equal(summary.retried, 1);
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
  assert.ok(queue.calls.some(({ done }) => done.includes(2)));
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

    // 10 s for a call, or less when the drain has less left (135 s into the isolate, its
    // deadline, which also stops the drain).
    clock.advance(cutAfter - 1);
    assert.equal(signals[0].aborted, false);
    clock.advance(1);
    assert.equal(signals[0].aborted, true, `a call at ${startAt} ms is cut after ${cutAfter}`);
    const summary = await settledOrFail(running.done, "the drain waited on a hung call");
    assert.equal(summary.stoppedBy, startAt === 0 ? "error" : "wall-clock limit");
  }
});
