// Machinery: the leases of a drain's running jobs (worker.ts). Every claim asks for a short
// lease (PGQUEUE_LEASE_SECONDS, 60 s by default, never longer than the isolate has left), and
// one heartbeat_many() call renews the leases of all the jobs running every third of it. So a
// job may run longer than its lease, and the jobs of an isolate killed without warning (the
// runtime's hard CPU limit, its memory limit) are claimable again within about a minute.
import type { Clock } from "./clock.ts";
import type { LogEvent } from "./log.ts";
import type { ClaimedJob, WorkerQueue } from "./queue.ts";
import type { CutAs } from "./report.ts";
import { describe } from "./run_job.ts";

/** The longest lease a claim asks for when the worker sets none. */
export const DEFAULT_LEASE_SECONDS = 60;
/** Leases are renewed three times per lease, so one failed renewal loses nothing. */
const RENEWALS_PER_LEASE = 3;
/** Time kept back at the end of a lease to report the job before the lease runs out. */
const LEASE_MARGIN_MS = 2000;

/** A job running under a lease. */
export interface LeasedJob {
  job: ClaimedJob;
  /** When its lease runs out (on the drain's clock), as last renewed. */
  leaseEnd: number;
  claimedAt: number;
  cut: AbortController;
  /** Why it was cut off, once it was: what becomes of it (report.ts). */
  cutAs?: CutAs;
}

/** Stops a running job: its handler's signal aborts with `reason`; `as` says what follows. */
export function cut(leased: LeasedJob, reason: unknown, as: CutAs): void {
  if (leased.cut.signal.aborted) return;
  leased.cutAs = as;
  leased.cut.abort(reason);
}

export interface LeaseOptions {
  queue: WorkerQueue;
  clock: Clock;
  log: (event: LogEvent) => void;
  /** The longest lease to ask for (PGQUEUE_LEASE_SECONDS). */
  capSeconds?: number;
  /** When the platform ends the isolate, on the clock. */
  isolateEnd: number;
  /** The jobs running now. */
  running: () => LeasedJob[];
  /** A signal for one Data API call. */
  callSignal: () => AbortSignal;
  /** Counts each heartbeat_many() call. */
  counted: () => void;
}

/** The leases of one drain: what a claim asks for, and their renewal while jobs run. */
export class Leases {
  private readonly options: LeaseOptions;

  constructor(options: LeaseOptions) {
    this.options = options;
  }

  /** The lease a claim or renewal asks for: the cap, never longer than the isolate has left. */
  seconds(): number {
    const { clock, isolateEnd } = this.options;
    const leftSeconds = Math.floor((isolateEnd - clock.now()) / 1000);
    return Math.max(Math.min(this.cap(), leftSeconds), 1);
  }

  /** Renews the leases of the jobs running, three times per lease, until `ended` aborts. */
  async keepRenewed(ended: AbortSignal): Promise<void> {
    const everyMs = (1000 * this.cap()) / RENEWALS_PER_LEASE;
    while (!ended.aborted) {
      await aborted(AbortSignal.any([this.options.clock.timeout(everyMs), ended]));
      if (ended.aborted) return;
      if (this.options.running().length > 0) await this.renew(everyMs);
    }
  }

  /**
   * One heartbeat_many() for every job running: a job it no longer lists lost its lease
   * (cancelled, or rescued) and is stopped. When the call fails, a job whose lease would run
   * out before the next renewal is stopped in time to be reported (failed: retried later).
   */
  private async renew(everyMs: number): Promise<void> {
    const { queue, clock, log } = this.options;
    const running = this.options.running();
    const leaseSeconds = this.seconds();
    const asked = clock.now();
    this.options.counted();
    try {
      const jobs = running.map(({ job }) => job);
      const held = new Set(
        await queue.heartbeatMany(jobs, leaseSeconds, this.options.callSignal()),
      );
      for (const leased of running) {
        if (held.has(leased.job.id)) {
          leased.leaseEnd = Math.max(leased.leaseEnd, asked + 1000 * leaseSeconds);
        } else {
          cut(leased, new Error("the job's lease was lost (cancelled or rescued)"), "lost");
        }
      }
    } catch (error) {
      log({ event: "queue.error", call: "heartbeat_many", error: describe(error) });
      const now = clock.now();
      for (const leased of running) {
        if (leased.leaseEnd - LEASE_MARGIN_MS <= now + everyMs) {
          const ranMs = Math.round(now - leased.claimedAt);
          const timeout = new Error(
            `the job's lease could not be renewed and was about to run out after ${ranMs} ms ` +
              `(${describe(error, false)}); it will be retried`,
          );
          timeout.name = "TimeoutError";
          cut(leased, timeout, "fail");
        }
      }
    }
  }

  private cap(): number {
    return this.options.capSeconds ?? DEFAULT_LEASE_SECONDS;
  }
}

/**
 * The lease the claim gave this job, from its row: the database's clock set both ends, so the
 * difference holds whatever this machine's clock says.
 */
export function leaseMsOf(job: ClaimedJob): number {
  const leaseMs = Date.parse(job.locked_until) - Date.parse(job.locked_at);
  if (!Number.isFinite(leaseMs)) {
    throw new Error(
      `complete_and_claim() returned job ${job.id} without locked_at and locked_until, ` +
        "which set its time limit: apply the project's migrations to the database",
    );
  }
  return leaseMs;
}

/** Resolves once `signal` aborts. */
export function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}
