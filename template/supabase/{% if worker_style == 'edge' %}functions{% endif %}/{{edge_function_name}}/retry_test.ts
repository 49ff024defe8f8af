import assert from "node:assert/strict";
import { z } from "zod";
import {
  backoffDelay,
  checkBackoff,
  DATABASE_BACKOFF,
  defineHandler,
  PermanentError,
  RetryAfter,
  retryDelay,
  Snooze,
  withBackoff,
} from "./job.ts";
import { drain, drainOptions, MemoryQueue, withApi } from "./testing.ts";

const ok = defineHandler(z.object({}), () => {});

Deno.test("RetryAfter takes 0 seconds or more, and says the delay", () => {
  assert.equal(new RetryAfter(30).seconds, 30);
  assert.equal(new RetryAfter(30).message, "retry after 30s");
  assert.equal(new RetryAfter(1.5, "the CRM's rate limit").message, "the CRM's rate limit");
  for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, 2e9]) {
    assert.throws(() => new RetryAfter(bad), /RetryAfter needs a delay of 0 to 1000000000 seconds/);
  }
});

Deno.test("a backoff grows by its factor up to its cap, jitter taking up to its share", () => {
  const curve = { base: 30, factor: 3, cap: 1800, jitter: 0 };
  assert.deepEqual([1, 2, 3, 4, 5].map((n) => backoffDelay(curve, n)), [30, 90, 270, 810, 1800]);
  // jitter 0.2: between 80% and 100% of the delay.
  assert.equal(backoffDelay({ ...curve, jitter: 0.2 }, 1, () => 0), 30);
  assert.equal(backoffDelay({ ...curve, jitter: 0.2 }, 1, () => 1), 24);
  // No field given: the database's curve, 5 s, 10 s, 20 s... an hour, the upper half drawn.
  assert.deepEqual(checkBackoff({}), DATABASE_BACKOFF);
  assert.equal(backoffDelay({}, 3, () => 0), 20);
  assert.equal(backoffDelay({}, 3, () => 1), 10);
  assert.equal(backoffDelay({}, 1000, () => 0), 3600);
});

Deno.test("a backoff that makes no sense is refused where the kind is registered", () => {
  for (const bad of [{ base: 0 }, { factor: 0.5 }, { base: 60, cap: 30 }, { cap: Infinity }]) {
    assert.throws(() => defineHandler(z.object({}), () => {}, { backoff: bad }), RangeError);
  }
  assert.throws(() => withBackoff(ok, { jitter: 1.5 }), /jitter is a share of the delay/);
});

Deno.test("the delay: a RetryAfter's, else the kind's own backoff, else the database's", () => {
  const handlers = {
    own: defineHandler(z.object({}), () => {}, { backoff: { base: 30, jitter: 0 } }),
    registered: withBackoff(ok, { base: 7, factor: 1, jitter: 0 }),
    plain: ok,
  };
  assert.equal(retryDelay(handlers, "own", 2, new RetryAfter(3)), 3);
  assert.equal(retryDelay(handlers, "own", 2, new Error("down")), 60);
  assert.equal(retryDelay(handlers, "registered", 4, new Error("down")), 7);
  assert.equal(retryDelay(handlers, "plain", 2, new Error("down")), undefined);
  assert.equal(retryDelay(handlers, "plain", 2, new RetryAfter(0)), 0);
  assert.equal(retryDelay(handlers, "unknown", 2, new Error("down")), undefined);
});

Deno.test("a drain fails each job with the delay its handler or kind chose", async () => {
  const queue = new MemoryQueue();
  const limited = queue.add("limited");
  const curved = queue.add("curved");
  const plain = queue.add("plain");
  const refused = queue.add("refused");
  const handlers = {
    limited: defineHandler(z.object({}), () => {
      throw new RetryAfter(120, "429 from the API");
    }, { backoff: { base: 5, jitter: 0 } }),
    curved: defineHandler(z.object({}), () => {
      throw new Error("the upstream API is down");
    }, { backoff: { base: 45, jitter: 0 } }),
    plain: defineHandler(z.object({}), () => {
      throw new Error("the upstream API is down");
    }),
    refused: defineHandler(z.object({}), () => {
      throw new PermanentError("gone");
    }, { backoff: { base: 45 } }),
  };
  const before = Date.now();
  const summary = await drain(["default"], drainOptions(queue, { handlers }));
  assert.equal(summary.retried, 3);
  assert.equal(summary.deadLettered, 1);
  const delays = Object.fromEntries(queue.failures.map((f) => [f.id, f.retryInSeconds]));
  assert.deepEqual(delays, {
    [limited.id]: 120,
    [curved.id]: 45,
    [plain.id]: undefined,
    [refused.id]: undefined,
  });
  const types = Object.fromEntries(queue.failures.map((f) => [f.id, f.errorType]));
  assert.deepEqual(types, {
    [limited.id]: "RetryAfter",
    [curved.id]: "Error",
    [plain.id]: "Error",
    [refused.id]: "PermanentError",
  });
  assert.equal(limited.lastError?.split("\n")[0], "RetryAfter: 429 from the API");
  assert.ok(limited.runAfter >= before + 120_000);
  assert.ok(plain.runAfter < before + 120_000);
});

Deno.test("fail() sends retry_in as an interval only when the worker chose a delay", async () => {
  await withApi(() => "queued", async (queue, got) => {
    const job = {
      id: 4,
      queue: "default",
      kind: "ok",
      payload: {},
      attempts: 1,
      max_attempts: 5,
      lock_token: "tok",
      locked_at: "",
      locked_until: "",
      concurrency_key: null,
    };
    assert.equal(await queue.fail(job, "boom", true, undefined, 2.5), "queued");
    assert.equal(await queue.fail(job, "boom", true, undefined, 1e-7), "queued");
    assert.equal(await queue.fail(job, "boom", true, undefined, 1e9), "queued");
    assert.equal(await queue.fail(job, "boom", true), "queued");
    const sent = { job_id: 4, lock_token: "tok", error: "boom", retryable: true };
    assert.deepEqual(got.map(({ path, body }) => [path, body]), [
      ["rpc/fail", {
        job_id: 4,
        lock_token: "tok",
        error: "boom",
        retryable: true,
        retry_in: "2.500 seconds",
      }],
      ["rpc/fail", { ...sent, retry_in: "0.000 seconds" }],
      ["rpc/fail", { ...sent, retry_in: "1000000000.000 seconds" }],
      ["rpc/fail", { job_id: 4, lock_token: "tok", error: "boom", retryable: true }],
    ]);
  });
});

Deno.test("Snooze takes 0 seconds or more and a cap from 1 to 10000", () => {
  assert.equal(new Snooze(30).seconds, 30);
  assert.equal(new Snooze(30).maxSnoozes, 100);
  assert.equal(new Snooze(0, 500).maxSnoozes, 500);
  for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(() => new Snooze(bad), /Snooze needs a delay of 0 to/);
  }
  for (const bad of [0, 10_001, 1.5]) {
    assert.throws(() => new Snooze(1, bad), /maxSnoozes must be a whole number from 1 to 10000/);
  }
});

Deno.test("a drain snoozes a job whose handler throws Snooze, its attempt not counted", async () => {
  const queue = new MemoryQueue();
  const waiting = queue.add("waiting");
  const capped = queue.add("capped");
  capped.snoozes = 2;
  const handlers = {
    waiting: defineHandler(z.object({}), () => {
      throw new Snooze(60);
    }),
    capped: defineHandler(z.object({}), () => {
      throw new Snooze(60, 2);
    }),
  };
  const before = Date.now();
  const summary = await drain(["default"], drainOptions(queue, { handlers }));
  assert.deepEqual([summary.snoozed, summary.retried, summary.deadLettered], [1, 0, 1]);
  assert.equal(queue.failures.length, 0, "a snooze is not a failure");
  assert.deepEqual([waiting.status, waiting.attempts, waiting.snoozes], ["queued", 0, 1]);
  assert.ok(waiting.runAfter >= before + 60_000);
  assert.equal(capped.status, "failed");
});

Deno.test("snooze() and fail() send what the SQL functions take", async () => {
  await withApi(() => "queued", async (queue, got) => {
    const job = {
      id: 4,
      queue: "default",
      kind: "ok",
      payload: {},
      attempts: 1,
      max_attempts: 5,
      lock_token: "tok",
      locked_at: "",
      locked_until: "",
      concurrency_key: null,
    };
    assert.equal(await queue.snooze(job, 1.5, 100), "queued");
    assert.equal(await queue.fail(job, "boom", true, undefined, undefined, "TypeError"), "queued");
    assert.deepEqual(got.map(({ path, body }) => [path, body]), [
      ["rpc/snooze", { job_id: 4, lock_token: "tok", seconds: 1.5, max_snoozes: 100 }],
      ["rpc/fail", {
        job_id: 4,
        lock_token: "tok",
        error: "boom",
        retryable: true,
        error_type: "TypeError",
      }],
    ]);
  });
});
