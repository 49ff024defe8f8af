// Machinery: telling the database how each job of a drain (worker.ts) ended. A job that ran to
// the end waits for the drain's next call, which completes it along with the next claim, its
// result too; one that threw is failed (retried later: after a RetryAfter's delay, else its
// kind's own backoff, else the database's; or dead-lettered); one that threw a Snooze is
// snoozed (run again later, its attempt not counted); one cut off by the
// deadline, the CPU budget or the function's unloading is released. The database measures a
// result as it stores it and may refuse one: then the jobs with a result are completed one at
// a time and the refused ones failed. The size limit for results is read once, when the first
// comes. Completions the database could not be reached for are tried again until it answers or
// the isolate is about to end: it takes them until a sweep takes their jobs back. Jobs end
// while a call is under way: each call sends the jobs that had ended when it started.
import { PermanentError, Snooze, UserFacingError } from "./job.ts";
import {
  type ClaimedJob,
  type DoneJob,
  MAX_RESULT_BYTES,
  QueueError,
  TOO_BIG,
  type WorkerQueue,
} from "./queue.ts";
import { describe, describeJob, type Outcome, ResultError } from "./run_job.ts";
import type { Clock } from "./clock.ts";
import type { LogEvent } from "./log.ts";

/** The pauses between tries of completions the database could not be reached for (the last
 * repeats). */
const RETRY_PAUSES_MS = [200, 400, 800, 1000];

/** What a drain's reports came to, job by job. */
export interface ReportCounts {
  /**
   * Jobs that ran to the end and were reported done: along with the next claim, or on their
   * own when the drain ended. (One whose lease was lost meanwhile is counted too; the
   * database leaves it to its new owner.)
   */
  completed: number;
  /** Failed attempts that go back to the queue after a backoff. */
  retried: number;
  /**
   * Failed attempts that moved their job to the dead letters (with a permanent error, a
   * result too large to store, or their last attempt).
   */
  deadLettered: number;
  /**
   * Jobs handed back to the queue unfinished, their attempt not counted: cut off by the
   * deadline, the CPU budget or the function's unloading.
   */
  released: number;
  /** Jobs whose handler asked to run them again later (a Snooze), their attempt not counted. */
  snoozed: number;
  /** Failed jobs whose lease was lost (rescued or cancelled) before they were reported. */
  stale: number;
  /** Jobs left running because reporting them failed; the sweeper rescues them. */
  unreported: number;
}

export interface ReporterOptions {
  queue: WorkerQueue;
  /** Where the counts go (the drain's summary). */
  counts: ReportCounts;
  log: (event: LogEvent) => void;
  /** Where the per-job lines go (job.released): log.ts's jobLog(). */
  jobLog: (event: LogEvent) => void;
  /**
   * The pause (seconds) before a failed job's next attempt: a RetryAfter's or its kind's own
   * backoff (job.ts's retryDelay()); undefined: the database's backoff().
   */
  retryDelay?: (job: ClaimedJob, error: unknown) => number | undefined;
  /** A signal for one Data API call. */
  callSignal: () => AbortSignal;
  /** The drain's clock: the pauses between tries of completions go by it. */
  clock: Clock;
}

/** What becomes of a job cut off while it ran: see Reporter.record(). */
export type CutAs = "release" | "lost" | "fail";

/** A call to complete_and_claim() that sends `done` along; what it returns is passed on. */
export type CompletingCall<T> = (done: readonly DoneJob[]) => Promise<T>;

export class Reporter {
  // Jobs that ran to the end, not yet reported: the next call takes them along.
  private finished: DoneJob[] = [];
  // When each finished job's lease runs out, by id, on the drain's clock.
  private readonly leaseEnds = new Map<number, number>();
  // The largest result the database stores, read when a job first returns one.
  private resultLimit: Promise<number> | undefined;
  private readonly options: ReporterOptions;
  private readonly counts: ReportCounts;

  constructor(options: ReporterOptions) {
    this.options = options;
    this.counts = options.counts;
  }

  /**
   * Reports how a job's run ended: a job that ran to the end waits for the next call. One cut
   * off goes as `cutAs` says: released (the deadline, the CPU budget or the unloading cut it),
   * left to its new owner (its lease was lost: heartbeat_many() no longer listed it), or
   * failed (its lease could not be renewed), like one that threw. Its lease runs out at
   * `leaseEnd` (on the drain's clock). True when it ran to the end.
   */
  async record(outcome: Outcome, cutAs: CutAs, leaseEnd: number): Promise<boolean> {
    if (outcome.ok) {
      this.finished.push({ job: outcome.job, result: outcome.result });
      this.leaseEnds.set(outcome.job.id, leaseEnd);
      return true;
    }
    if (outcome.cut && cutAs === "lost") {
      this.counts.stale += 1;
      this.options.log({ event: "job.stale", ...describeJob(outcome.job), error: "lease lost" });
    } else if (outcome.cut && cutAs === "release") await this.release(outcome.job);
    else if (!outcome.cut && outcome.error instanceof Snooze) {
      await this.snooze(outcome.job, outcome.error);
    } else await this.fail(outcome.job, outcome.error);
    return false;
  }

  /** Whether jobs that ran to the end wait to be reported. */
  hasFinished(): boolean {
    return this.finished.length > 0;
  }

  /**
   * Makes `call` with the finished jobs, which are then counted as completed. When the
   * database refuses a result, the jobs with one are completed one at a time first (failing
   * the ones refused), and `call` is made again with the others.
   */
  async completeWith<T>(call: CompletingCall<T>): Promise<T> {
    let sending = this.take();
    let answer: T;
    try {
      answer = await call(sending);
    } catch (error) {
      this.putBack(sending);
      if (!isTooBig(error) || !sending.some(({ result }) => result !== null)) throw error;
      // The database measures a result as it stores it (jsonb), which can be larger than its
      // JSON text (a long array of small numbers is), and then refuses the whole call.
      await this.completeOneByOne();
      sending = this.take();
      try {
        answer = await call(sending);
      } catch (again) {
        this.putBack(sending);
        throw again;
      }
    }
    // Only now: if the call failed, they are still to report (again, which is harmless if
    // the call went through after all).
    this.counts.completed += sending.length;
    for (const { job } of sending) this.leaseEnds.delete(job.id);
    return answer;
  }

  /** The finished jobs, for one call; those that end meanwhile wait for the next. */
  private take(): DoneJob[] {
    const taken = this.finished;
    this.finished = [];
    return taken;
  }

  /** Jobs a call failed to report, back in front of those that ended meanwhile. */
  private putBack(jobs: DoneJob[]): void {
    this.finished = [...jobs, ...this.finished];
  }

  /**
   * Sends the completions that no claim took along (the drain stopped after their batch),
   * with `call`. When the database cannot be reached, they are tried again, each with
   * complete(), which says whether the database took it, until it answers or `until` (on the
   * drain's clock) comes: it takes a completion until a sweep takes the job back, even after
   * its lease ran out. Each is logged as what it came to: `job.done_late` (after its lease
   * ran out), `job.done_refused` (its job taken back: it runs again), or `job.unreported`
   * (counted unreported: the sweeper takes its job back when its lease runs out).
   */
  async completeRest(call: CompletingCall<unknown>, until: number): Promise<void> {
    if (this.finished.length === 0) return;
    let failure: unknown;
    try {
      return void await this.completeWith(call);
    } catch (error) {
      failure = error;
    }
    const clock = this.options.clock;
    for (let tries = 0; this.finished.length > 0 && unreachable(failure); tries++) {
      const pause = RETRY_PAUSES_MS[Math.min(tries, RETRY_PAUSES_MS.length - 1)];
      if (clock.now() + pause >= until) break;
      await clock.sleep(pause);
      try {
        await this.completeEach();
      } catch (error) {
        failure = error;
      }
    }
    if (this.finished.length > 0) this.unreported(failure);
  }

  /** Hands the job back to the queue, its attempt not counted (stale: its lease was lost). */
  async release(job: ClaimedJob): Promise<void> {
    try {
      if (await this.options.queue.release(job, this.options.callSignal())) {
        this.counts.released += 1;
        this.options.jobLog({ event: "job.released", ...describeJob(job) });
      } else {
        this.counts.stale += 1;
        this.options.log({ event: "job.stale", ...describeJob(job), error: "lease lost" });
      }
    } catch (error) {
      this.counts.unreported += 1;
      this.options.log({
        event: "queue.error",
        call: "release",
        id: job.id,
        error: describe(error),
      });
    }
  }

  /**
   * Hands the job back to run after the delay its handler asked for, its attempt not counted
   * (past its maxSnoozes the database dead-letters it instead).
   */
  async snooze(job: ClaimedJob, snooze: Snooze): Promise<void> {
    try {
      const signal = this.options.callSignal();
      const status = await this.options.queue.snooze(
        job,
        snooze.seconds,
        snooze.maxSnoozes,
        signal,
      );
      if (status === "queued") this.counts.snoozed += 1;
      else if (status === "failed") this.counts.deadLettered += 1;
      else this.counts.stale += 1;
      const event = status === "queued"
        ? "job.snoozed"
        : status === null
        ? "job.stale"
        : "job.failed";
      (status === "queued" ? this.options.jobLog : this.options.log)({
        event,
        ...describeJob(job),
        seconds: snooze.seconds,
      });
    } catch (queueError) {
      this.counts.unreported += 1;
      this.options.log({ event: "queue.error", call: "snooze", error: describe(queueError) });
    }
  }

  /**
   * fail()s the job: retried later, or dead-lettered when `error` is permanent. A
   * UserFacingError goes to failUserFacing(), which records its message for the job's owner.
   */
  async fail(job: ClaimedJob, error: unknown): Promise<void> {
    const retryable = !(error instanceof PermanentError);
    // The place a result was refused is the worker's, not the handler's: no stack.
    const stored = describe(error, !(error instanceof ResultError));
    try {
      const signal = this.options.callSignal();
      const status = error instanceof UserFacingError
        ? await this.options.queue.failUserFacing(job, error.message, signal)
        : await this.options.queue.fail(
          job,
          stored,
          retryable,
          signal,
          retryable ? this.options.retryDelay?.(job, error) : undefined,
          errorType(error),
        );
      if (status === "queued") this.counts.retried += 1;
      else if (status === "failed") this.counts.deadLettered += 1;
      else this.counts.stale += 1;
      this.options.log({
        event: status === null ? "job.stale" : `job.${status}`,
        ...describeJob(job),
        error: describe(error, false),
      });
    } catch (queueError) {
      this.counts.unreported += 1;
      const call = error instanceof UserFacingError ? "fail_user_facing" : "fail";
      this.options.log({ event: "queue.error", call, error: describe(queueError) });
    }
  }

  /** The largest result the database stores (max_result_bytes), read once; see run_job.ts. */
  maxResultBytes(): Promise<number> {
    return this.resultLimit ??= this.options.queue.maxResultBytes(this.options.callSignal())
      .catch((error) => {
        this.options.log({
          event: "queue.error",
          call: "config",
          error: describe(error),
          assumed: { max_result_bytes: MAX_RESULT_BYTES },
        });
        return MAX_RESULT_BYTES;
      });
  }

  /** Completes each finished job with complete(), logging a late or refused one as such. */
  private async completeEach(): Promise<void> {
    for (const done of [...this.finished]) {
      let taken: boolean;
      try {
        taken = await this.options.queue.complete(done.job, done.result, this.options.callSignal());
      } catch (error) {
        if (!isTooBig(error)) throw error;
        this.finished = this.finished.filter((other) => other !== done);
        await this.fail(done.job, tooBig(error));
        continue;
      }
      this.finished = this.finished.filter((other) => other !== done);
      if (!taken) {
        this.counts.stale += 1;
        this.options.log({ event: "job.done_refused", ...describeJob(done.job) });
        continue;
      }
      this.counts.completed += 1;
      if (this.options.clock.now() > (this.leaseEnds.get(done.job.id) ?? Infinity)) {
        this.options.log({ event: "job.done_late", ...describeJob(done.job) });
      }
    }
  }

  private unreported(error: unknown): void {
    this.counts.unreported += this.finished.length;
    this.options.log({
      event: "queue.error",
      call: "complete_and_claim",
      jobs: this.finished.map(({ job }) => job.id),
      error: describe(error),
    });
    for (const { job } of this.finished) {
      this.options.log({ event: "job.unreported", ...describeJob(job) });
    }
    this.finished = [];
  }

  private async completeOneByOne(): Promise<void> {
    for (const done of this.finished.filter(({ result }) => result !== null)) {
      try {
        await this.options.queue.complete(done.job, done.result, this.options.callSignal());
        this.counts.completed += 1;
      } catch (error) {
        if (!isTooBig(error)) throw error;
        await this.fail(done.job, tooBig(error));
      }
      this.finished = this.finished.filter((other) => other !== done);
    }
  }
}

function isTooBig(error: unknown): error is QueueError {
  return error instanceof QueueError && error.code === TOO_BIG;
}

function tooBig(error: QueueError): ResultError {
  return new ResultError(`the database refused the handler's result: ${error.reason}`);
}

/**
 * Did the call fail without the database's answer (the network, a timeout, or PostgREST
 * unable to reach it: PGRST000-003)? Then it may take the same call later.
 */
function unreachable(error: unknown): boolean {
  return !(error instanceof QueueError) || error.code === "" || /^PGRST00[0-3]$/.test(error.code);
}

/** The type a failed attempt is listed with: the error's name (`TypeError`, `RetryAfter`). */
function errorType(error: unknown): string | undefined {
  return error instanceof Error ? error.name : undefined;
}
