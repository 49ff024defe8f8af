// The drain (worker.ts) once the queues run dry: its linger, the wake-ups that join it, and
// its check-ins for the queues it was woken for.
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
} from "./testing.ts";
import type { LogEvent } from "./log.ts";
import { type Drain, startDrain } from "./worker.ts";

Deno.test("after the queues run dry, the drain lingers and runs jobs that come late", async () => {
  const ran: number[] = [];
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const clock = new FakeClock();
  clock.at(300, () => queue.add("ok", { n: 2 }));
  clock.at(1900, () => queue.add("ok", { n: 3 }));

  const summary = await drain(
    ["default"],
    drainOptions(queue, {
      handlers: { ...drainHandlers, ok: recordingOk(ran) },
      lingerMs: 2000,
      lingerPollMs: 100,
      clock,
    }),
  );

  assert.deepEqual(ran, [1, 2, 3]);
  assert.equal(summary.completed, 3);
  assert.equal(summary.stoppedBy, "empty");
  // Claims 100, 200, 400, 800 ms apart (the last pause cut to the window's end), and one
  // more at once after each job, to report it. The job added at 300 ms was found then; the
  // one added at 1,900 ms at 2,300 ms, which started the window over, and it ended 2 s later.
  assert.equal(summary.elapsedMs, 4300);
  assert.deepEqual(
    queue.claims.map(({ done }) => done),
    [[], [1], [], [], [2], [], [], [], [], [], [3], [], [], [], [], []],
  );
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
    drainOptions(queue, { lingerMs: 0, clock }),
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
    drainOptions(queue, {
      timeBudgetMs: 1000,
      lingerMs: 5000,
      lingerPollMs: 100,
      clock,
    }),
  );

  // Claims at 0, 100, 300 and 700 ms; the next pause (800 ms) would pass the budget's end.
  assert.equal(summary.stoppedBy, "time budget");
  assert.equal(summary.elapsedMs, 700);
  assert.equal(queue.claims.length, 4);
});

Deno.test("a lingering drain polls every woken queue", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  clock.at(500, () => queue.add("ok", { n: 1 }, { queue: "webhooks" }));

  const summary = await drain(
    ["emails", "webhooks"],
    drainOptions(queue, { lingerMs: 1000, lingerPollMs: 250, clock }),
  );

  assert.deepEqual(queue.byStatus("done"), [1]);
  assert.equal(summary.stoppedBy, "empty");
  // Both queues at 0, 250 and 750 ms, where webhooks had a job, reported at once by one more
  // claim; then both again 250, 500 and the 250 ms left of the window later.
  assert.equal(summary.elapsedMs, 1750);
  const claimsOf = (name: string) => queue.claims.filter(({ queue }) => queue === name);
  assert.equal(claimsOf("emails").length, 6);
  assert.equal(claimsOf("webhooks").length, 7);
});

Deno.test("an idle drain makes a few calls, then none: at most a few a minute", async () => {
  for (const [lingerMs, calls] of [[2000, 6], [60_000, 11]]) {
    const queue = new MemoryQueue();
    const clock = new FakeClock();
    const summary = await drain(
      ["default"],
      drainOptions(queue, { lingerMs, lingerPollMs: 100, timeBudgetMs: 100_000, clock }),
    );
    // 0, 100, 300, 700, 1,500 and 2,000 ms by default; pauses that double up to 25.6 s with
    // the longest linger the settings allow (a claim every 100 ms would be 600 a minute).
    assert.equal(summary.calls, calls, `with a ${lingerMs} ms linger`);
    assert.equal(summary.elapsedMs, lingerMs);
    assert.equal(summary.stoppedBy, "empty");
  }
});

Deno.test("a wake-up joins a lingering drain, which starts its window over", async () => {
  const queue = new MemoryQueue();
  const clock = new FakeClock();
  const joins: boolean[] = [];
  const running = startDrain(
    ["default"],
    drainOptions(queue, { lingerMs: 1000, lingerPollMs: 100, clock }),
  );
  clock.at(800, () => joins.push(running.join(["default"])));
  // Past the first window (which ended at 1,000 ms), inside the one the join started.
  clock.at(1700, () => queue.add("ok", { n: 1 }));

  const summary = await running.done;

  assert.deepEqual(joins, [true]);
  assert.equal(summary.wakeUps, 2);
  assert.equal(summary.completed, 1);
  // The join at 800 ms started the window and its pauses over: claims at 1,000, 1,100, 1,300
  // and 1,700 ms, which found the job; the window after it ended at 2,700 ms.
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
    drainOptions(queue, { lingerMs: 1000, lingerPollMs: 100, clock: { ...clock, sleep } }),
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
    drainOptions(queue, {
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
  await drain(["default", "mail"], drainOptions(queue));
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

  const summary = await drain(["default"], drainOptions(queue, { log: (e) => events.push(e) }));

  assert.equal(summary.completed, 1);
  assert.ok(events.some((e) => e.event === "queue.error" && e.call === "checkin"));
});

// -- results and progress ---------------------------------------------------------------
