// Test helpers (used by the *_test.ts files only). For your handlers' tests: runJob() and
// jobContext() (testing_run.ts), withFakeDataApi() with assertEnqueued() (testing_enqueue.ts),
// and against a database drainQueue() (testing_drain.ts; queueClock() is imported from
// testing_clock.ts), shown in README.md. For the machinery's tests: an in-memory queue that
// follows the SQL functions' rules for claims, leases, lock tokens, attempts, results and
// progress, a Data API that records what it is sent (withApi, testing_api.ts), and the
// handlers, options and waits the drain's tests share; with the clock that tests move and the
// CPU meter handlers spend on (fakes.ts).
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, type HandlerMap, PermanentError } from "./job.ts";
import {
  type Attempt,
  type ClaimedJob,
  type CompleteAndClaimOptions,
  type DoneJob,
  type FailOutcome,
  type Json,
  MAX_RESULT_BYTES,
  QueueError,
  TOO_BIG,
  type WorkerQueue,
} from "./queue.ts";
import { type DrainOptions, type DrainSummary, startDrain } from "./worker.ts";
export { FakeClock, FakeCpuMeter } from "./fakes.ts";
// For your own tests: a handler run with a made-up job, and what a test enqueued.
export * from "./testing_run.ts";
export * from "./testing_enqueue.ts";
// For your tests against a database (db_tests/): a queue drained through the handlers.
export * from "./testing_drain.ts";
// For the queue client's tests: a Data API that records what it is sent.
export * from "./testing_api.ts";

export interface StoredJob extends ClaimedJob {
  status: "queued" | "running" | "done" | "failed";
  lastError: string | null;
  /** When it may be claimed (Date.now() milliseconds). */
  runAfter: number;
  result: Json;
  progress: Json;
  /** How many times it snoozed (snooze()). */
  snoozes: number;
}

/** A call of completeAndClaim(), with the ids of the jobs it completed. */
export type Call = Omit<CompleteAndClaimOptions, "done" | "signal"> & { done: number[] };

export class MemoryQueue implements WorkerQueue {
  jobs: StoredJob[] = [];
  calls: Call[] = [];
  /** `max_result_bytes` in the database's config; undefined: reading it fails. */
  resultLimit: number | undefined = MAX_RESULT_BYTES;
  /**
   * A result's size as the database measures it (as jsonb); by default its JSON text's.
   * Tests make it larger to play a result that the worker's own check lets through.
   */
  storedBytes: (result: Json) => number = (result) =>
    new TextEncoder().encode(JSON.stringify(result)).length;
  /** The lease configured in the database: what a claim without a lease gets. */
  leaseSeconds = 300;
  /** How long a retried job waits; the database's backoff is at least 2.5 s. */
  backoffMs = 2500;
  /** Called before each call, e.g. to move a fake clock on or to throw. */
  beforeCall: (call: Call) => void = () => {};
  /** Each heartbeatMany() call: the ids it renewed and the lease it asked for. */
  heartbeats: { ids: number[]; leaseSeconds: number }[] = [];
  /** Called before each heartbeatMany(), e.g. to throw. */
  beforeHeartbeat: () => void = () => {};

  add(
    kind: string,
    payload: unknown = {},
    options: { queue?: string; maxAttempts?: number; concurrencyKey?: string } = {},
  ) {
    const job: StoredJob = {
      id: this.jobs.length + 1,
      queue: options.queue ?? "default",
      kind,
      payload,
      attempts: 0,
      max_attempts: options.maxAttempts ?? 5,
      lock_token: "",
      locked_at: "",
      locked_until: "",
      concurrency_key: options.concurrencyKey ?? null,
      status: "queued",
      lastError: null,
      runAfter: 0,
      result: null,
      progress: null,
      snoozes: 0,
    };
    this.jobs.push(job);
    return job;
  }

  byStatus(status: StoredJob["status"]): number[] {
    return this.jobs.filter((job) => job.status === status).map((job) => job.id);
  }

  /** The calls that claimed (max_jobs above 0), whether or not they found jobs. */
  get claims(): Call[] {
    return this.calls.filter((call) => call.maxJobs > 0);
  }

  completeAndClaim(options: CompleteAndClaimOptions): Promise<ClaimedJob[]> {
    const { signal: _signal, ...sent } = options;
    const call = { ...sent, done: options.done.map(({ job }) => job.id) };
    this.calls.push(call);
    this.beforeCall(call);
    // One transaction: a result too large refuses the whole call; a stale token's job is left
    // alone; then the next batch is claimed.
    for (const done of options.done) this.checkSize(done);
    for (const { job: claimed, result } of options.done) this.finish(claimed, result);
    const claimed = this.jobs
      .filter((job) =>
        job.status === "queued" && job.runAfter <= Date.now() && job.queue === options.queue &&
        options.kinds.includes(job.kind)
      )
      .slice(0, options.maxJobs);
    const lockedAt = Date.now();
    const leaseMs = 1000 * (options.leaseSeconds ?? this.leaseSeconds);
    for (const job of claimed) {
      job.status = "running";
      job.attempts += 1;
      job.lock_token = crypto.randomUUID();
      job.locked_at = new Date(lockedAt).toISOString();
      job.locked_until = new Date(lockedAt + leaseMs).toISOString();
    }
    return Promise.resolve(claimed.map((job) => ({ ...job })));
  }

  complete(attempt: Attempt, result: Json = null): Promise<boolean> {
    try {
      this.checkSize({ job: attempt as ClaimedJob, result });
    } catch (error) {
      return Promise.reject(error);
    }
    return Promise.resolve(this.finish(attempt, result));
  }

  progress(attempt: Attempt, progress: Json): Promise<boolean> {
    const job = this.holder(attempt);
    if (job !== undefined) job.progress = progress;
    return Promise.resolve(job !== undefined);
  }

  maxResultBytes(): Promise<number> {
    if (this.resultLimit === undefined) {
      return Promise.reject(new Error("permission denied for table config"));
    }
    return Promise.resolve(this.resultLimit);
  }

  /** The kinds open to the app's users, and the owner of each job one of them submitted. */
  clientKindList: string[] = [];
  owners = new Map<number, string>();
  /** The ids of each jobOwners() call. */
  ownerCalls: number[][] = [];

  clientKinds(): Promise<string[]> {
    return Promise.resolve([...this.clientKindList]);
  }

  jobOwners(ids: readonly number[]): Promise<Map<number, string>> {
    this.ownerCalls.push([...ids]);
    return Promise.resolve(
      new Map(ids.flatMap((id) => this.owners.has(id) ? [[id, this.owners.get(id)!]] : [])),
    );
  }

  /** What dependencyResults() answers for each job id (none: no rows). */
  dependencyRows = new Map<number, unknown[]>();

  dependencyResults(id: number): Promise<unknown[]> {
    return Promise.resolve(this.dependencyRows.get(id) ?? []);
  }

  checkins: { worker: string; queue: string; kinds: string[] }[] = [];

  checkin(worker: string, queue: string, kinds: string[]): Promise<void> {
    this.checkins.push({ worker, queue, kinds });
    return Promise.resolve();
  }

  /** heartbeat_many(): renews the leases still held (never shortening one); their ids. */
  heartbeatMany(attempts: readonly Attempt[], leaseSeconds: number): Promise<number[]> {
    this.heartbeats.push({ ids: attempts.map(({ id }) => id), leaseSeconds });
    try {
      this.beforeHeartbeat();
    } catch (error) {
      return Promise.reject(error);
    }
    const held = attempts.flatMap((attempt) => {
      const job = this.holder(attempt);
      if (job === undefined) return [];
      const renewed = Date.now() + 1000 * leaseSeconds;
      if (renewed > Date.parse(job.locked_until)) {
        job.locked_until = new Date(renewed).toISOString();
      }
      return [job.id];
    });
    return Promise.resolve(held);
  }

  /** The leases claims asked for, in order. */
  get leases(): (number | undefined)[] {
    return this.claims.map((claim) => claim.leaseSeconds);
  }

  /** release(): the job goes back to the queue, due now, its attempt not counted. */
  release(attempt: Attempt): Promise<boolean> {
    const job = this.holder(attempt);
    if (job === undefined) return Promise.resolve(false);
    job.status = "queued";
    job.attempts = Math.max(job.attempts - 1, 0);
    job.lock_token = "";
    job.runAfter = 0;
    return Promise.resolve(true);
  }

  /**
   * snooze(): the job goes back to the queue after `seconds`, its attempt not counted; past
   * `maxSnoozes` snoozes, to the dead letters.
   */
  snooze(attempt: Attempt, seconds: number, maxSnoozes: number): Promise<FailOutcome> {
    const job = this.holder(attempt);
    if (job === undefined) return Promise.resolve(null);
    if (job.snoozes >= maxSnoozes) {
      job.status = "failed";
      job.lastError = `snoozed ${maxSnoozes} times, its cap (max_snoozes)`;
      return Promise.resolve("failed");
    }
    job.snoozes += 1;
    job.status = "queued";
    job.attempts = Math.max(job.attempts - 1, 0);
    job.lock_token = "";
    job.runAfter = Date.now() + 1000 * seconds;
    return Promise.resolve("queued");
  }

  /**
   * Each fail() call: the job, the delay the worker chose (undefined: the database's) and the
   * error's type.
   */
  failures: { id: number; retryInSeconds: number | undefined; errorType?: string }[] = [];

  fail(
    claimed: ClaimedJob,
    error: string,
    retryable: boolean,
    _signal?: AbortSignal,
    retryInSeconds?: number,
    errorType?: string,
  ): Promise<FailOutcome> {
    this.failures.push({ id: claimed.id, retryInSeconds, errorType });
    const job = this.holder(claimed);
    if (job === undefined) return Promise.resolve(null);
    job.status = retryable && job.attempts < job.max_attempts ? "queued" : "failed";
    job.lastError = error;
    job.runAfter = Date.now() +
      (retryInSeconds === undefined ? this.backoffMs : 1000 * retryInSeconds);
    return Promise.resolve(job.status);
  }

  /** fail_user_facing(): to the dead letters (the database keeps the message for the owner). */
  failUserFacing(claimed: ClaimedJob, message: string): Promise<FailOutcome> {
    return this.fail(claimed, `UserFacingError: ${message}`, false);
  }

  /** _complete_jobs()'s check: SQLSTATE 54000 for a result over the limit. */
  private checkSize({ job, result }: DoneJob): void {
    const bytes = result === null ? 0 : this.storedBytes(result);
    const limit = this.resultLimit ?? MAX_RESULT_BYTES;
    if (bytes > limit) {
      const reason = `the result of job ${job.id} is ${bytes} bytes; the limit is ${limit} ` +
        "(max_result_bytes)";
      throw new QueueError(
        `pgqueue._complete_jobs() failed: ${reason}`,
        "complete()",
        TOO_BIG,
        reason,
      );
    }
  }

  /** Marks the job done with its result, if `claimed` still holds its lease. */
  private finish(claimed: Attempt, result: Json): boolean {
    const job = this.holder(claimed);
    if (job === undefined) return false;
    job.status = "done";
    job.result = result;
    job.progress = null;
    return true;
  }

  /** The stored job, if `claimed` still holds its lease. */
  private holder(claimed: Attempt): StoredJob | undefined {
    return this.jobs.find((job) =>
      job.id === claimed.id && job.status === "running" && job.lock_token === claimed.lock_token
    );
  }
}

// -- drains ----------------------------------------------------------------------------------

/** The `ok` kind: records each job's `n` in `ran`. */
export function recordingOk(ran: number[]) {
  return defineHandler(z.object({ n: z.number() }), ({ n }) => {
    ran.push(n);
  });
}

/**
 * The kinds drain tests claim: `ok` (payload {n}), `boom` (a plain error, retried), `refused`
 * (a PermanentError) and `slow` (runs until its signal aborts).
 */
export const drainHandlers: HandlerMap = {
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

/** A drain's options for tests: 3 slots, a 10 s budget, no linger, no logs. */
export function drainOptions(
  queue: MemoryQueue,
  overrides: Partial<DrainOptions> = {},
): DrainOptions {
  return {
    queue,
    handlers: drainHandlers,
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
export function drain(queues: readonly string[], options: DrainOptions): Promise<DrainSummary> {
  return startDrain(queues, options).done;
}

/** Lets the drain's pending promises run (no time passes on the test's clock). */
export async function settle(): Promise<void> {
  for (let turn = 0; turn < 20; turn++) await new Promise((resolve) => setTimeout(resolve, 0));
}

/** `done`, or a failure naming `what` if it has not settled once the event loop is idle. */
export async function settledOrFail<T>(done: Promise<T>, what: string): Promise<T> {
  let settledValue: { value: T } | undefined;
  done.then((value) => settledValue = { value });
  await settle();
  if (settledValue === undefined) throw new assert.AssertionError({ message: what });
  return settledValue.value;
}
