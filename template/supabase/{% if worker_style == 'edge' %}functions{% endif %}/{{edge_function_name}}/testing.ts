// Test helpers (used by the *_test.ts files only): an in-memory queue that follows the SQL
// functions' rules for claims, leases, lock tokens and attempts, and a clock that tests move.
import type { ClaimedJob, CompleteAndClaimOptions, FailOutcome, Queue } from "./queue.ts";

export interface StoredJob extends ClaimedJob {
  status: "queued" | "running" | "done" | "failed";
  lastError: string | null;
  /** When it may be claimed (Date.now() milliseconds). */
  runAfter: number;
}

/** A call of completeAndClaim(), with the ids of the jobs it completed. */
export type Call = Omit<CompleteAndClaimOptions, "done"> & { done: number[] };

export class MemoryQueue implements Queue {
  jobs: StoredJob[] = [];
  calls: Call[] = [];
  /** The lease configured in the database: what a claim without a lease gets. */
  leaseSeconds = 300;
  /** How long a retried job waits; the database's backoff is at least 2.5 s. */
  backoffMs = 2500;
  /** Called before each call, e.g. to move a fake clock on or to throw. */
  beforeCall: (call: Call) => void = () => {};

  add(kind: string, payload: unknown = {}, options: { queue?: string; maxAttempts?: number } = {}) {
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
      status: "queued",
      lastError: null,
      runAfter: 0,
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
    const call = { ...options, done: options.done.map((job) => job.id) };
    this.calls.push(call);
    this.beforeCall(call);
    // One transaction: a stale token's job is left alone, then the next batch is claimed.
    const done = options.done.map((job) => this.holder(job)).filter((job) => job !== undefined);
    for (const job of done) job.status = "done";
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

  checkins: { worker: string; queue: string; kinds: string[] }[] = [];

  checkin(worker: string, queue: string, kinds: string[]): Promise<void> {
    this.checkins.push({ worker, queue, kinds });
    return Promise.resolve();
  }

  fail(claimed: ClaimedJob, error: string, retryable: boolean): Promise<FailOutcome> {
    const job = this.holder(claimed);
    if (job === undefined) return Promise.resolve(null);
    job.status = retryable && job.attempts < job.max_attempts ? "queued" : "failed";
    job.lastError = error;
    job.runAfter = Date.now() + this.backoffMs;
    return Promise.resolve(job.status);
  }

  /** The stored job, if `claimed` still holds its lease. */
  private holder(claimed: ClaimedJob): StoredJob | undefined {
    return this.jobs.find((job) =>
      job.id === claimed.id && job.status === "running" && job.lock_token === claimed.lock_token
    );
  }
}

/**
 * A clock for drain()'s `now` and `sleep`: sleeping moves it on at once, and what a test
 * scheduled with `at()` happens when the clock passes its time.
 */
export class FakeClock {
  time = 0;
  private scheduled: { at: number; run: () => void }[] = [];

  now = (): number => this.time;

  sleep = (ms: number): Promise<void> => {
    this.advance(ms);
    return Promise.resolve();
  };

  advance(ms: number): void {
    this.time += ms;
    const due = this.scheduled.filter((item) => item.at <= this.time);
    this.scheduled = this.scheduled.filter((item) => item.at > this.time);
    for (const item of due) item.run();
  }

  at(time: number, run: () => void): void {
    this.scheduled.push({ at: time, run });
  }
}
