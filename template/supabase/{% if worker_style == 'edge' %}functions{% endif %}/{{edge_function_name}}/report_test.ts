// How a drain reports its jobs' ends (report.ts): failures retried or dead-lettered, leases
// lost, completions resent or logged, results and their size limit, progress.
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, type HandlerMap } from "./job.ts";
import { drain, drainOptions, FakeClock, MemoryQueue, settle, settledOrFail } from "./testing.ts";
import { startDrain } from "./worker.ts";
import type { LogEvent } from "./log.ts";

Deno.test("a failing job never stops the batch, and its error is stored", async () => {
  const queue = new MemoryQueue();
  queue.add("ok", { n: 1 });
  const boom = queue.add("boom");
  queue.add("ok", { n: 2 });

  const summary = await drain(["default"], drainOptions(queue, { batchSize: 10 }));

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
  queue.backoffMs = 0; // due again at once: the slot it freed claims it again

  const summary = await drain(["default"], drainOptions(queue));

  assert.equal(summary.retried, 1);
  assert.equal(summary.deadLettered, 1);
  assert.equal(boom.status, "failed");
  assert.equal(boom.attempts, 2);
});

Deno.test("invalid payloads and permanent errors are dead-lettered at once", async () => {
  const queue = new MemoryQueue();
  const invalid = queue.add("ok", { n: "one" });
  const refused = queue.add("refused");

  const summary = await drain(["default"], drainOptions(queue));

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
    drainOptions(queue, { handlers: stealing, log: (event) => events.push(event) }),
  );

  assert.deepEqual([job.status, job.lock_token], ["running", newTokens[0]]);
  assert.deepEqual([failing.status, failing.lock_token], ["running", newTokens[1]]);
  assert.ok(
    queue.calls.some(({ done }) => done.includes(job.id)),
    "its completion was sent, and ignored",
  );
  assert.equal(summary.stale, 1, "fail() says when the lease was lost");
  assert.ok(events.some((event) => event.event === "job.stale" && event.id === failing.id));
});

Deno.test("a job handed back after its lease was lost counts stale, not released", async () => {
  const queue = new MemoryQueue();
  const slow = queue.add("slow");
  const events: LogEvent[] = [];
  const running = startDrain(
    ["default"],
    drainOptions(queue, { clock: new FakeClock(), log: (event) => events.push(event) }),
  );
  await settle();
  Object.assign(slow, { lock_token: crypto.randomUUID() }); // another worker's attempt now

  running.unload();
  const summary = await settledOrFail(running.done, "the drain did not stop");

  assert.deepEqual([summary.released, summary.stale], [0, 1]);
  assert.ok(events.some((event) => event.event === "job.stale" && event.id === slow.id));
});

Deno.test("completions a failed call carried are sent again before the drain ends", async () => {
  const queue = new MemoryQueue();
  for (let n = 1; n <= 5; n++) queue.add("ok", { n });
  queue.beforeCall = () => {
    if (queue.calls.length === 2) throw new Error("502 Bad Gateway");
  };

  const summary = await drain(["default"], drainOptions(queue));

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

  const summary = await drain(
    ["default"],
    drainOptions(queue, { handlers: returning, batchSize: 4 }),
  );

  assert.equal(summary.completed, 4);
  // Each with the next claim once it ended: those without a result first, as the others
  // waited for the size limit to be read.
  assert.deepEqual(queue.calls.map(({ done }) => done), [[], [3, 4], [1, 2]]);
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
    drainOptions(queue, { handlers: returning, batchSize: 2, timeBudgetMs: 70, clock }),
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

  const summary = await drain(
    ["default"],
    drainOptions(queue, { handlers: returning, batchSize: 10 }),
  );

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

  await drain(["default"], drainOptions(queue, { handlers: returning }));

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

  await drain(["default"], drainOptions(queue, { handlers: returning, batchSize: 10 }));

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
    drainOptions(queue, { handlers: returning, batchSize: 3, log: (event) => events.push(event) }),
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

  await drain(["default"], drainOptions(queue, { handlers: returning }));
  assert.equal(reads, 0, "jobs without results need no limit");

  for (let n = 1; n <= 5; n++) queue.add("echo", { result: n });
  await drain(["default"], drainOptions(queue, { handlers: returning, batchSize: 2 }));
  assert.equal(reads, 1);
});

Deno.test("when the limit cannot be read, 65536 bytes applies and the failure is logged", async () => {
  const queue = new MemoryQueue();
  queue.resultLimit = undefined;
  const fits = queue.add("big", { bytes: 65536 });
  const over = queue.add("big", { bytes: 65537 });
  const events: LogEvent[] = [];

  await drain(
    ["default"],
    drainOptions(queue, { handlers: returning, log: (e) => events.push(e) }),
  );

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

  await drain(["default"], drainOptions(queue, { handlers: reporting }));

  assert.deepEqual(seen, ["tenant-7", true, { done: 1, of: 2 }, false, { done: 1, of: 2 }]);
  assert.equal(job.status, "running", "left to its new owner");
});
