// Test helpers (used by the *_test.ts files only): an in-memory queue that follows the SQL
// functions' rules for claims, leases, lock tokens and attempts, and a clock that tests move.
import type { ClaimedJob, ClaimOptions, FailOutcome, Queue } from "./queue.ts";

export interface StoredJob extends ClaimedJob {
  status: "queued" | "running" | "done" | "failed";
  lastError: string | null;
}

export class MemoryQueue implements Queue {
  jobs: StoredJob[] = [];
  claims: ClaimOptions[] = [];
  /** The lease configured in the database: what a claim without a lease gets. */
  leaseSeconds = 300;
  /** Called before each claim, e.g. to move a fake clock on or to throw. */
  beforeClaim: (options: ClaimOptions) => void = () => {};

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
    };
    this.jobs.push(job);
    return job;
  }

  byStatus(status: StoredJob["status"]): number[] {
    return this.jobs.filter((job) => job.status === status).map((job) => job.id);
  }

  claim(options: ClaimOptions): Promise<ClaimedJob[]> {
    this.claims.push(options);
    this.beforeClaim(options);
    const claimed = this.jobs
      .filter((job) =>
        job.status === "queued" && job.queue === options.queue &&
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

  completeMany(jobs: readonly ClaimedJob[]): Promise<number[]> {
    const done = jobs.map((claimed) => this.holder(claimed)).filter((job) => job !== undefined);
    for (const job of done) job.status = "done";
    return Promise.resolve(done.map((job) => job.id));
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
