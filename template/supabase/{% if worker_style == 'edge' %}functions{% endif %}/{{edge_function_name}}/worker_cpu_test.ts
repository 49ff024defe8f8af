// The drain (worker.ts) within the Edge runtime's CPU and log limits: CPU-heavy kinds run alone
// and a few per isolate, claiming stops near the soft limit and what it holds is handed back
// before the hard one (cpu.ts); a burst of jobs logs under the runtime's limit (log.ts).
import assert from "node:assert/strict";
import { z } from "zod";
import { CpuBudget, type CpuLimits } from "./cpu.ts";
import { defineHandler, type HandlerMap } from "./job.ts";
import type { LogEvent } from "./log.ts";
import {
  drain,
  drainHandlers,
  drainOptions,
  FakeClock,
  FakeCpuMeter,
  MemoryQueue,
  settle,
} from "./testing.ts";

/** A budget on a fake meter: soft 100 ms, hard 200 ms (hands back at 150), `heavy` heavy. */
function budget(limits: Partial<CpuLimits> = {}) {
  const meter = new FakeCpuMeter();
  const cpu = new CpuBudget(meter, {
    softLimitMs: 100,
    hardLimitMs: 200,
    heavyKinds: ["heavy"],
    heavyPerIsolate: 1,
    ...limits,
  });
  return { meter, cpu };
}

/** Handlers that spend `ms` of CPU and record how many jobs ran at once as each started. */
function spending(meter: FakeCpuMeter, ms: number) {
  let inFlight = 0;
  const seen: { kind: string; inFlight: number }[] = [];
  const run = (kind: string) =>
    defineHandler(z.object({}), async () => {
      inFlight += 1;
      seen.push({ kind, inFlight });
      meter.spend(ms);
      await new Promise((resolve) => setTimeout(resolve, 0));
      inFlight -= 1;
    });
  const handlers: HandlerMap = { light: run("light"), heavy: run("heavy") };
  return { handlers, seen };
}

Deno.test("a CPU-heavy kind runs alone: the pool empties first, and waits for it", async () => {
  const queue = new MemoryQueue();
  for (const kind of ["light", "light", "heavy", "light", "light"]) queue.add(kind);
  const { meter, cpu } = budget({ softLimitMs: 10_000, hardLimitMs: 20_000 });
  const { handlers, seen } = spending(meter, 1);

  const summary = await drain(["default"], drainOptions(queue, { handlers, cpu }));

  assert.equal(summary.completed, 5);
  assert.deepEqual(seen.filter(({ kind }) => kind === "heavy"), [{ kind: "heavy", inFlight: 1 }]);
  const heavyClaim = queue.claims.find(({ kinds }) => kinds.includes("heavy"));
  assert.deepEqual([heavyClaim?.kinds, heavyClaim?.maxJobs], [["heavy"], 1]);
  assert.ok(
    queue.claims.every(({ kinds }) => kinds.length === 1),
    "light and heavy kinds are never claimed together",
  );
});

Deno.test("an isolate runs at most PGQUEUE_CPU_HEAVY_PER_ISOLATE heavy jobs, over its drains", async () => {
  const queue = new MemoryQueue();
  const heavy = [queue.add("heavy"), queue.add("heavy"), queue.add("heavy")];
  const { meter, cpu } = budget({ softLimitMs: 10_000, hardLimitMs: 20_000, heavyPerIsolate: 2 });
  const { handlers } = spending(meter, 1);

  await drain(["default"], drainOptions(queue, { handlers, cpu }));
  const second = await drain(["default"], drainOptions(queue, { handlers, cpu }));

  assert.deepEqual(heavy.map((job) => job.status), ["done", "done", "queued"]);
  assert.equal(second.claimed, 0, "the isolate's two are spent: the next isolate runs it");
});

Deno.test("claiming stops near the soft limit; the jobs running end as usual", async () => {
  const queue = new MemoryQueue();
  for (let n = 0; n < 10; n++) queue.add("light");
  const { meter, cpu } = budget();
  const { handlers } = spending(meter, 20);

  const summary = await drain(
    ["default"],
    drainOptions(queue, { handlers, cpu, batchSize: 1, maxJobsInFlight: 1 }),
  );

  // 20 ms each, and 1 ms a call: after the fifth, past 90% of the soft limit.
  assert.equal(summary.stoppedBy, "cpu budget");
  assert.deepEqual([summary.claimed, summary.completed, summary.released], [5, 5, 0]);
  assert.ok(summary.cpuMs >= 100 + summary.calls, `${summary.cpuMs} ms`);
  assert.equal(queue.byStatus("queued").length, 5, "left for another isolate");
  assert.equal(queue.calls.at(-1)?.maxJobs, 0, "the last completion went on its own");
});

Deno.test("each Data API call is charged to the budget: the meter cannot see it", async () => {
  const queue = new MemoryQueue();
  const { cpu } = budget();

  const summary = await drain(["default"], drainOptions(queue, { cpu }));

  // The claim that found nothing, the check-in and the read of the kinds open to users.
  assert.equal(summary.calls, 1);
  assert.equal(summary.cpuMs, 3);
});

Deno.test("near the hard limit, the jobs running are handed back, their attempts not counted", async () => {
  const queue = new MemoryQueue();
  const jobs = [queue.add("burn"), queue.add("burn"), queue.add("burn")];
  const { meter, cpu } = budget();
  const events: LogEvent[] = [];
  // Each spends 60 ms, then waits (on I/O) until told to stop.
  const handlers: HandlerMap = {
    burn: defineHandler(z.object({}), (_payload, context) => {
      meter.spend(60);
      return drainHandlers.slow({}, context);
    }),
  };

  const summary = await drain(
    ["default"],
    drainOptions(queue, { handlers, cpu, log: (event) => events.push(event) }),
  );

  // 180 ms counted: past 75% of the 200 ms hard limit, before the runtime's beforeunload
  // (90%) and its kill (100%).
  assert.equal(summary.stoppedBy, "cpu budget");
  assert.equal(summary.released, 3);
  assert.deepEqual(jobs.map((job) => [job.status, job.attempts]), [
    ["queued", 0],
    ["queued", 0],
    ["queued", 0],
  ]);
  assert.deepEqual(events, [], "a release is no failure: no log line at the default level");
});

Deno.test("no heavy job starts when less CPU is left than the heaviest took", async () => {
  const queue = new MemoryQueue();
  const [first, second] = [queue.add("heavy"), queue.add("heavy")];
  const { meter, cpu } = budget({ softLimitMs: 1000, hardLimitMs: 1000, heavyPerIsolate: 5 });
  const { handlers } = spending(meter, 400);

  const summary = await drain(["default"], drainOptions(queue, { handlers, cpu }));

  // 400 ms spent, and 750 ms (75% of the hard limit) is where the drain hands back.
  assert.deepEqual([first.status, second.status], ["done", "queued"]);
  assert.equal(summary.stoppedBy, "empty");
});

Deno.test("100 jobs a second log under the runtime's 100 lines per 10 s; at debug, a line each", async () => {
  for (const [logLevel, most] of [["info", 20], ["debug", 2000]] as const) {
    const queue = new MemoryQueue();
    const clock = new FakeClock();
    // 100 jobs a second for 10 s, one in a hundred failing.
    for (let i = 0; i < 1000; i++) {
      clock.at(i * 10, () => queue.add(i % 100 === 0 ? "boom" : "ok", { n: i }));
    }
    queue.backoffMs = 60_000;
    const events: { at: number; event: LogEvent }[] = [];
    const summary = await drain(
      ["default"],
      drainOptions(queue, {
        clock,
        lingerMs: 2000,
        timeBudgetMs: 100_000,
        logLevel,
        log: (event) => events.push({ at: clock.now(), event }),
      }),
    );
    await settle();

    assert.equal(summary.completed + summary.retried, 1000);
    assert.equal(summary.retried, 10);
    const failures = events.filter(({ event }) => event.event === "job.queued");
    assert.equal(failures.length, 10, "a line per failure");
    // The drain's own line (http.ts writes it from the summary) is one more.
    const lines = events.length + 1;
    assert.ok(lines <= most, `${lines} lines at ${logLevel}`);
    if (logLevel === "info") assert.ok(lines < 100, "under the limit");
    else assert.ok(lines > 1000, "a line per job at debug");
  }
});
