// Machinery: a drain, the work of the wake-ups an instance gets. Claim a batch, run its jobs
// concurrently, fail the ones that threw, and claim the next batch in the same call that
// completes the ones that ran to the end; go on until the queues are empty, then linger:
// claim again every few tens of milliseconds for a while, in case more jobs come, until the
// window passes with nothing to do or the deadline is near. A wake-up that comes meanwhile
// joins the drain. The deadline is the earlier of the time budget and the isolate's own
// wall-clock limit (less a margin): at the deadline, or when the runtime unloads the function
// (`beforeunload`), claiming stops and the jobs still running are released (their attempt not
// counted, unless it is the job's third release in a row); completions that no claim took
// along are sent before the drain ends. What a handler returns rides along with its
// completion as the job's result, once checked against the database's size limit (each job's
// run: run_job.ts; how each job's end is reported: report.ts).
import { type Clock, systemClock } from "./clock.ts";
import { type LogEvent, logJson } from "./log.ts";
import type { HandlerMap } from "./job.ts";
import type { ClaimedJob, DoneJob, WorkerQueue } from "./queue.ts";
import { JobOwners } from "./owners.ts";
import { type ReportCounts, Reporter } from "./report.ts";
import { describe, type JobRunContext, runJob } from "./run_job.ts";
export interface DrainOptions {
  queue: WorkerQueue;
  handlers: HandlerMap;
  /** Recorded on each claimed job (locked_by). */
  workerId: string;
  batchSize: number;
  /** The most jobs one claim takes and runs at once (default: batchSize). */
  maxJobsInFlight?: number;
  /** The lease claims ask for; without it, the lease configured in the database. */
  leaseSeconds?: number;
  /** Stop claiming once this much time has passed since the drain started. */
  timeBudgetMs: number;
  /**
   * How long the platform lets an isolate live (wall clock), counted from `isolateStartedAt`:
   * 150 s on the free plan, 400 s on paid plans.
   */
  wallClockLimitMs: number;
  /** When the isolate started, on the clock (default: when the drain started). */
  isolateStartedAt?: number;
  /** The longest a Data API call may take (default 10 s), and never longer than time left. */
  callTimeoutMs?: number;
  /** Go on claiming for this long after the queues ran dry (default 0: stop at once). */
  lingerMs?: number;
  /** How often to claim while lingering. */
  lingerPollMs: number;
  clock?: Clock;
  log?: (event: LogEvent) => void;
}

/** What a drain did; the counts of its jobs' ends are ReportCounts' (report.ts). */
export interface DrainSummary extends ReportCounts {
  /** The wake-ups this drain served: the one that started it and those that joined it. */
  wakeUps: number;
  /** complete_and_claim() calls made. */
  calls: number;
  claimed: number;
  /**
   * Why claiming stopped: the queues stayed empty for the whole linger window, the time
   * budget ran out, the isolate's wall-clock limit was near, the runtime unloaded the
   * function, or a call to the API failed.
   */
  stoppedBy: "empty" | "time budget" | "wall-clock limit" | "unload" | "error";
  error?: string;
  elapsedMs: number;
}

/** A drain under way, which later wake-ups join. */
export interface Drain {
  readonly queues: readonly string[];
  /**
   * Hands this drain another wake-up, for `queues` (added to those it drains): it claims
   * again at once and starts its linger window over; its deadline stays. False once it has
   * stopped claiming; then the wake-up needs a drain of its own.
   */
  join(queues: readonly string[]): boolean;
  /** The runtime is unloading the function: stop claiming, release the jobs running. */
  unload(): void;
  readonly done: Promise<DrainSummary>;
}

/** The share of the wall-clock limit kept back to release and report what is in hand. */
const WALL_CLOCK_MARGIN = 0.1;
/** Time kept back at the end of a lease to report the job before the lease runs out. */
const LEASE_MARGIN_MS = 2000;
/** Time kept back at the isolate's end: completions are tried again until then, no later. */
const REPORT_MARGIN_MS = 1000;
const DEFAULT_CALL_TIMEOUT_MS = 10_000;

/** Starts draining `queues`; see Drain. */
export function startDrain(queues: readonly string[], options: DrainOptions): Drain {
  return new QueueDrain(queues, options);
}

class QueueDrain implements Drain {
  readonly queues: string[];
  readonly done: Promise<DrainSummary>;
  readonly summary: DrainSummary = {
    wakeUps: 1,
    calls: 0,
    claimed: 0,
    completed: 0,
    retried: 0,
    deadLettered: 0,
    released: 0,
    stale: 0,
    unreported: 0,
    stoppedBy: "empty",
    elapsedMs: 0,
  };
  private readonly options: DrainOptions;
  private readonly clock: Clock;
  private readonly log: (event: LogEvent) => void;
  private readonly kinds: string[];
  private readonly started: number;
  /** When claiming stops and running handlers are cut off; and why then. */
  private readonly deadline: number;
  private readonly deadlineReason: "time budget" | "wall-clock limit";
  /** When the platform ends the isolate: the last reports must be sent by then. */
  private readonly isolateEnd: number;
  private readonly claimSize: number;
  // When the queues were last found dry, while this drain lingers; undefined while it works.
  private drySince: number | undefined;
  private joined = false;
  private stopped = false;
  private interruptPause: AbortController | undefined;
  private cutBatch: AbortController | undefined;
  private readonly reporter: Reporter;
  private readonly checkins: Promise<void>[] = [];
  private readonly owners: JobOwners;
  // The lease the database gives a claim that asks for none, once a claim has shown it.
  private databaseLeaseSeconds: number | undefined;

  constructor(queues: readonly string[], options: DrainOptions) {
    this.options = options;
    this.clock = options.clock ?? systemClock;
    this.log = options.log ?? logJson;
    this.kinds = Object.keys(options.handlers);
    this.queues = [...new Set(queues)];
    this.started = this.clock.now();
    const limitMs = options.wallClockLimitMs;
    this.isolateEnd = (options.isolateStartedAt ?? this.started) + limitMs;
    const budgetEnd = this.started + options.timeBudgetMs;
    const isolateDeadline = this.isolateEnd - limitMs * WALL_CLOCK_MARGIN;
    this.deadline = Math.min(budgetEnd, isolateDeadline);
    this.deadlineReason = budgetEnd <= isolateDeadline ? "time budget" : "wall-clock limit";
    this.claimSize = Math.min(options.batchSize, options.maxJobsInFlight ?? options.batchSize);
    this.reporter = new Reporter({
      queue: options.queue,
      counts: this.summary,
      log: this.log,
      callSignal: () => this.callSignal(),
      clock: this.clock,
    });
    this.checkIn(this.queues);
    this.owners = new JobOwners(options.queue, this.callSignal(), this.log);
    this.done = this.run();
  }

  join(queues: readonly string[]): boolean {
    if (this.stopped) return false;
    const added = queues.filter((queue) => !this.queues.includes(queue));
    this.queues.push(...added);
    this.checkIn(added);
    this.summary.wakeUps += 1;
    this.joined = true;
    this.interruptPause?.abort();
    return true;
  }

  unload(): void {
    if (this.stopped && this.summary.stoppedBy === "unload") return;
    this.stop("unload");
    this.interruptPause?.abort();
    this.cutBatch?.abort(new DOMException("the function is being unloaded", "AbortError"));
  }

  private async run(): Promise<DrainSummary> {
    try {
      await this.claimUntilDone();
    } catch (error) {
      this.stop("error");
      this.summary.error = describe(error);
    }
    // Part of the drain's work (what the Edge runtime waits for): once that settles, the
    // function may be shut down, and completions not sent by then would be lost.
    await this.reporter.completeRest(
      (done) => this.call(this.queues[0], 0, done),
      this.isolateEnd - REPORT_MARGIN_MS,
    );
    await Promise.all(this.checkins);
    this.summary.elapsedMs = Math.round(this.clock.now() - this.started);
    return this.summary;
  }

  private stop(reason: DrainSummary["stoppedBy"]): void {
    if (this.stopped && reason !== "unload") return;
    this.stopped = true;
    this.summary.stoppedBy = reason;
  }

  /** Claims and runs batches, lingering when the queues run dry, until it should stop. */
  private async claimUntilDone(): Promise<void> {
    // The longest a batch has taken so far: when less time than that is left, another batch
    // might not finish before the deadline, so the drain stops claiming.
    let slowestBatchMs = 0;
    let active: string[] = this.queues;
    while (!this.stopped) {
      if (this.joined) {
        this.joined = false;
        this.drySince = undefined;
        active = [...this.queues];
      }
      if (active.length === 0) {
        if (!(await this.linger(slowestBatchMs))) return;
        active = [...this.queues];
        continue;
      }
      const again: string[] = [];
      for (const queue of active) {
        if (this.stopped) return;
        if (this.clock.now() + slowestBatchMs >= this.deadline) {
          return this.stop(this.deadlineReason);
        }
        const batchStarted = this.clock.now();
        const jobs = await this.completeAndClaim(queue, this.claimSize);
        if (jobs.length === 0) continue;
        this.drySince = undefined;
        this.summary.claimed += jobs.length;
        const ranToTheEnd = await this.runBatch(jobs, batchStarted);
        slowestBatchMs = Math.max(slowestBatchMs, this.clock.now() - batchStarted);
        if (this.clock.now() >= this.deadline) return this.stop(this.deadlineReason);
        // A full batch: more may wait. A short one with jobs to report: they go at once,
        // with one more claim (as cheap as sending them alone), not after a linger pause.
        if (jobs.length === this.claimSize || ranToTheEnd > 0) again.push(queue);
      }
      active = again;
    }
  }

  /**
   * Every queue came back empty, or short of a full batch with nothing to report: one pause
   * of the linger window. False when the window passed with nothing found (or the deadline
   * is near), and the drain stops.
   */
  private async linger(slowestBatchMs: number): Promise<boolean> {
    const lingerMs = this.options.lingerMs ?? 0;
    const pollMs = this.options.lingerPollMs;
    this.drySince ??= this.clock.now();
    const lingerLeft = this.drySince + lingerMs - this.clock.now();
    if (lingerLeft <= 0) {
      this.stop("empty");
      return false;
    }
    const pause = Math.min(pollMs, lingerLeft);
    if (this.clock.now() + pause + slowestBatchMs >= this.deadline) {
      this.stop(this.deadlineReason);
      return false;
    }
    this.interruptPause = new AbortController();
    await this.clock.sleep(pause, this.interruptPause.signal);
    this.interruptPause = undefined;
    return !this.stopped;
  }

  /** A signal for one Data API call: its timeout, shorter than the time left until `end`. */
  private callSignal(end = this.isolateEnd): AbortSignal {
    const timeoutMs = this.options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    return this.clock.timeout(Math.min(timeoutMs, end - this.clock.now()));
  }

  /** Completes the finished jobs and claims up to `maxJobs` of `queue`, in one call. */
  private completeAndClaim(queue: string, maxJobs: number): Promise<ClaimedJob[]> {
    return this.reporter.completeWith((done) => this.call(queue, maxJobs, done));
  }

  /** One complete_and_claim() call: completes `done`, claims up to `maxJobs` of `queue`. */
  private call(queue: string, maxJobs: number, done: readonly DoneJob[]): Promise<ClaimedJob[]> {
    this.summary.calls += 1;
    return this.options.queue.completeAndClaim({
      worker: this.options.workerId,
      done,
      queue,
      kinds: this.kinds,
      maxJobs,
      // (A call that only completes claims nothing: its lease is moot.)
      leaseSeconds: maxJobs > 0 ? this.leaseSeconds() : this.options.leaseSeconds,
      // A claim must answer before the deadline; completions alone, before the isolate ends.
      signal: this.callSignal(maxJobs > 0 ? this.deadline : this.isolateEnd),
    });
  }

  /**
   * The lease a claim asks for: the worker's (PGQUEUE_LEASE_SECONDS), or none for the
   * database's; never longer than the isolate has left, so the jobs of an isolate that is
   * killed without warning go back to the queue soon after.
   */
  private leaseSeconds(): number | undefined {
    const lease = this.options.leaseSeconds ?? this.databaseLeaseSeconds;
    const leftSeconds = Math.max(Math.floor((this.isolateEnd - this.clock.now()) / 1000), 1);
    return lease !== undefined && leftSeconds < lease ? leftSeconds : this.options.leaseSeconds;
  }

  /**
   * Runs the batch and reports its failures; returns how many jobs ran to the end. Handlers
   * are stopped at the deadline and before their lease ends, so each job is reported before
   * the sweeper could hand it to another worker. A job cut off by the deadline (or by the
   * unloading) is released; one that outlived its lease failed.
   */
  private async runBatch(jobs: ClaimedJob[], batchStarted: number): Promise<number> {
    if (this.stopped) {
      // The function is being unloaded: the jobs just claimed go back at once.
      for (const job of jobs) await this.reporter.release(job);
      return 0;
    }
    await this.owners.assign(jobs, this.callSignal(this.deadline));
    const leaseMs = shortestLeaseMs(jobs);
    if (this.options.leaseSeconds === undefined && this.databaseLeaseSeconds === undefined) {
      this.databaseLeaseSeconds = Math.round(leaseMs / 1000);
    }
    const leaseEnd = batchStarted + leaseMs - LEASE_MARGIN_MS;
    const cutByDeadline = this.deadline <= leaseEnd;
    const stopAt = Math.min(this.deadline, leaseEnd);
    const limitMs = Math.max(Math.round(stopAt - this.clock.now()), 0);
    this.cutBatch = new AbortController();
    const signal = AbortSignal.any([this.cutBatch.signal, this.clock.timeout(limitMs)]);
    const context: JobRunContext = {
      handlers: this.options.handlers,
      queue: this.options.queue,
      clock: this.clock,
      log: this.log,
      maxResultBytes: () => this.reporter.maxResultBytes(),
      callSignal: () => this.callSignal(),
    };
    const outcomes = await Promise.all(
      jobs.map((job) => runJob(job, signal, limitMs, context)),
    );
    this.cutBatch = undefined;
    return await this.reporter.record(
      outcomes,
      () => cutByDeadline || this.stopped,
      batchStarted + leaseMs,
    );
  }

  /**
   * Says which kinds this worker claims from `queues` (so `unclaimed` does not list them),
   * next to the first claim rather than before it; a failure is logged and changes nothing.
   */
  private checkIn(queues: readonly string[]): void {
    for (const queue of queues) {
      this.checkins.push(
        this.options.queue.checkin(this.options.workerId, queue, this.kinds, this.callSignal())
          .catch((error) => {
            this.log({ event: "queue.error", call: "checkin", error: describe(error) });
          }),
      );
    }
  }
}

/**
 * The lease the claim gave these jobs, from their rows: the database's clock set both ends,
 * so the difference holds whatever this machine's clock says.
 */
function shortestLeaseMs(jobs: readonly ClaimedJob[]): number {
  const leases = jobs.map((job) => {
    const leaseMs = Date.parse(job.locked_until) - Date.parse(job.locked_at);
    if (!Number.isFinite(leaseMs)) {
      throw new Error(
        `complete_and_claim() returned job ${job.id} without locked_at and locked_until, ` +
          "which set its time limit: apply the project's migrations to the database",
      );
    }
    return leaseMs;
  });
  return Math.min(...leases);
}
