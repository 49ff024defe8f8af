// Machinery: a drain, the work of the wake-ups an instance gets. It keeps a pool of slots full
// (pool.ts): a job that ends frees its slot at once, and the next claim fills it, completing
// the jobs that ran to the end in the same call. Claims ask for short leases, renewed while
// their jobs run (leases.ts); the isolate's CPU time is a budget (cpu.ts); once the queues run
// dry, the drain lingers (waits.ts), and a wake-up that comes meanwhile joins it. At the
// deadline (the time budget, or the isolate's wall-clock limit less a margin), near the CPU
// limit, or when the runtime unloads the function (`beforeunload`), claiming stops and the jobs
// still running are released (their attempt not counted, unless it is the job's third release
// in a row); completions that no claim took along are sent before the drain ends. (Each job's
// run: run_job.ts; how each job's end is reported: report.ts.)
import { type Clock, systemClock } from "./clock.ts";
import { charged, type CpuBudget, unlimitedBudget } from "./cpu.ts";
import { jobLog, type LogEvent, logJson } from "./log.ts";
import type { ClaimedJob, DoneJob, WorkerQueue } from "./queue.ts";
import { retryDelay } from "./job.ts";
import { JobOwners } from "./owners.ts";
import { Reporter } from "./report.ts";
import { describe, type JobRunContext, runJob } from "./run_job.ts";
import { aborted, leaseMsOf, Leases } from "./leases.ts";
import { type Lane, Pool, type Slot } from "./pool.ts";
import { Waits } from "./waits.ts";
import type { Drain, DrainOptions, DrainSummary } from "./drain.ts";

export type { Drain, DrainOptions, DrainSummary } from "./drain.ts";

/** The share of the wall-clock limit kept back to release and report what is in hand. */
const WALL_CLOCK_MARGIN = 0.1;
/** Time kept back at the isolate's end: completions are tried again until then, no later. */
const REPORT_MARGIN_MS = 1000;
const DEFAULT_CALL_TIMEOUT_MS = 10_000;
/** Starts draining `queues`; see Drain. */
export function startDrain(queues: readonly string[], options: DrainOptions): Drain {
  return new QueueDrain(queues, options);
}

class QueueDrain implements Drain {
  readonly queues: string[] = [];
  readonly done: Promise<DrainSummary>;
  readonly summary: DrainSummary = {
    wakeUps: 1,
    calls: 0,
    heartbeats: 0,
    claimed: 0,
    completed: 0,
    retried: 0,
    deadLettered: 0,
    released: 0,
    snoozed: 0,
    stale: 0,
    unreported: 0,
    stoppedBy: "empty",
    elapsedMs: 0,
    cpuMs: 0,
  };
  private readonly options: DrainOptions;
  private readonly clock: Clock;
  private readonly log: (event: LogEvent) => void;
  private readonly kinds: string[];
  private readonly cpu: CpuBudget;
  // The queue, each call charged to the CPU budget.
  private readonly queue: WorkerQueue;
  private readonly started: number;
  private readonly cpuAtStart: number;
  /** When claiming stops and running handlers are cut off; and why then. */
  private readonly deadline: number;
  private readonly deadlineReason: "time budget" | "wall-clock limit";
  /** When the platform ends the isolate: the last reports must be sent by then. */
  private readonly isolateEnd: number;
  private readonly pool: Pool;
  private readonly leases: Leases;
  // Each job's run up to its report, which the drain's end waits for.
  private readonly runs = new Set<Promise<void>>();
  // The longest a job has taken, from its claim to its end: when less time is left, another
  // job might not end before the deadline, so the drain stops claiming.
  private slowestJobMs = 0;
  private readonly waits: Waits;
  private stopped = false;
  private readonly ended = new AbortController();
  private readonly reporter: Reporter;
  private readonly checkins: Promise<void>[] = [];
  private readonly owners: JobOwners;
  private readonly context: JobRunContext;

  constructor(queues: readonly string[], options: DrainOptions) {
    this.options = options;
    this.clock = options.clock ?? systemClock;
    this.log = options.log ?? logJson;
    this.kinds = Object.keys(options.handlers);
    this.cpu = options.cpu ?? unlimitedBudget();
    this.queue = charged(options.queue, this.cpu.meter);
    this.started = this.clock.now();
    this.cpuAtStart = this.cpu.meter.busyMs();
    const limitMs = options.wallClockLimitMs;
    this.isolateEnd = (options.isolateStartedAt ?? this.started) + limitMs;
    const budgetEnd = this.started + options.timeBudgetMs;
    const isolateDeadline = this.isolateEnd - limitMs * WALL_CLOCK_MARGIN;
    this.deadline = Math.min(budgetEnd, isolateDeadline);
    this.deadlineReason = budgetEnd <= isolateDeadline ? "time budget" : "wall-clock limit";
    this.pool = new Pool(
      options.maxJobsInFlight ?? options.batchSize,
      options.batchSize,
      this.cpu,
      this.clock,
    );
    this.leases = new Leases({
      queue: this.queue,
      clock: this.clock,
      log: this.log,
      capSeconds: options.leaseSeconds,
      isolateEnd: this.isolateEnd,
      running: () => [...this.pool.running.values()],
      callSignal: () => this.callSignal(),
      counted: () => this.summary.heartbeats += 1,
    });
    this.waits = new Waits(this.clock, options.lingerPollMs, options.lingerMs ?? 0);
    const jobLines = jobLog(this.log, options.logLevel);
    this.reporter = new Reporter({
      queue: this.queue,
      counts: this.summary,
      log: this.log,
      jobLog: jobLines,
      callSignal: () => this.callSignal(),
      clock: this.clock,
      retryDelay: (job, error) => retryDelay(options.handlers, job.kind, job.attempts, error),
    });
    this.context = {
      handlers: options.handlers,
      queue: this.queue,
      clock: this.clock,
      jobLog: jobLines,
      meter: this.cpu.meter,
      maxResultBytes: () => this.reporter.maxResultBytes(),
      callSignal: () => this.callSignal(),
    };
    this.addQueues(queues);
    this.owners = new JobOwners(this.queue, this.callSignal(), this.log);
    this.done = this.run();
  }

  join(queues: readonly string[]): boolean {
    if (this.stopped) return false;
    this.addQueues(queues);
    this.summary.wakeUps += 1;
    this.waits.restart();
    this.pool.wakeLanes();
    this.waits.kick();
    return true;
  }

  unload(reason?: string): void {
    if (this.stopped && this.summary.stoppedBy === "unload") return;
    this.stop("unload");
    if (reason !== undefined) this.summary.unloadReason = reason;
    this.pool.cutAll(new DOMException("the function is being unloaded", "AbortError"), "release");
  }

  private async run(): Promise<DrainSummary> {
    const stopWatchingCpu = this.cpu.meter.onBusy(() => this.checkCpu());
    const renewing = this.leases.keepRenewed(this.ended.signal);
    this.cutAtDeadline();
    try {
      await this.claimUntilDone();
    } catch (error) {
      this.stop("error");
      this.summary.error = describe(error);
    }
    while (this.runs.size > 0) await Promise.all([...this.runs]);
    this.ended.abort();
    stopWatchingCpu();
    await renewing;
    // Part of the drain's work (what the Edge runtime waits for): once that settles, the
    // function may be shut down, and completions not sent by then would be lost.
    await this.reporter.completeRest(
      (done) => this.call(this.pool.lanes[0], 0, done),
      this.isolateEnd - REPORT_MARGIN_MS,
    );
    await Promise.all(this.checkins);
    this.summary.elapsedMs = Math.round(this.clock.now() - this.started);
    this.summary.cpuMs = Math.round(this.cpu.meter.busyMs() - this.cpuAtStart);
    return this.summary;
  }

  private stop(reason: DrainSummary["stoppedBy"]): void {
    if (this.stopped && reason !== "unload") return;
    this.stopped = true;
    this.summary.stoppedBy = reason;
    this.waits.kick();
  }

  /** Fills free slots, lingering when the queues run dry, until it should stop claiming. */
  private async claimUntilDone(): Promise<void> {
    while (!this.stopped) {
      this.checkCpu();
      if (this.stopped) return;
      if (this.clock.now() + this.slowestJobMs >= this.deadline) {
        return this.stop(this.deadlineReason);
      }
      const lane = this.pool.nextLane();
      const refillAt = lane === undefined ? undefined : this.pool.refillAt(lane);
      if (lane !== undefined && refillAt === undefined) await this.claim(lane);
      else if (lane !== undefined) await this.waits.next(refillAt);
      else if (this.pool.running.size > 0) await this.waits.next();
      else if (!(await this.linger())) return;
    }
  }

  /** One claim for `lane`, completing the jobs that ended; starts each job it took. */
  private async claim(lane: Lane): Promise<void> {
    const wanted = this.pool.wanted(lane);
    const claimedAt = this.clock.now();
    const jobs = await this.reporter.completeWith((done) => this.call(lane, wanted, done));
    if (jobs.length < wanted) lane.active = false;
    if (jobs.length === 0) return;
    this.waits.restart();
    this.summary.claimed += jobs.length;
    if (this.stopped) {
      // The function is being unloaded (or the budget ran out) during the call: the jobs just
      // claimed go back at once.
      for (const job of jobs) await this.reporter.release(job);
      return;
    }
    const leases = jobs.map(leaseMsOf);
    await this.owners.assign(jobs, this.callSignal(this.deadline));
    jobs.forEach((job, i) => this.start(job, lane, claimedAt, leases[i]));
  }

  /** Runs `job` in a slot: when it ends, the slot is free at once, then its end is reported. */
  private start(job: ClaimedJob, lane: Lane, claimedAt: number, leaseMs: number): void {
    const slot: Slot = {
      job,
      lane,
      leaseEnd: claimedAt + leaseMs,
      claimedAt,
      cut: new AbortController(),
    };
    this.pool.running.set(job.id, slot);
    this.cpu.meter.watch(true);
    const heavyEnded = lane.heavy ? this.cpu.startHeavy() : undefined;
    const cpuBefore = this.cpu.meter.busyMs();
    const run = runJob(job, slot.cut.signal, this.context).then(async (outcome) => {
      this.pool.running.delete(job.id);
      if (this.pool.running.size === 0) this.cpu.meter.watch(false);
      heavyEnded?.(this.cpu.meter.busyMs() - cpuBefore);
      if (slot.cutAs === undefined) {
        this.slowestJobMs = Math.max(this.slowestJobMs, this.clock.now() - claimedAt);
      }
      lane.active = true;
      // Recorded before the claim loop wakes, so that its next call takes the job along.
      const reported = this.reporter.record(outcome, slot.cutAs ?? "fail", slot.leaseEnd);
      this.checkCpu();
      this.waits.kick();
      await reported;
    }).catch((error) => this.log({ event: "queue.error", call: "report", error: describe(error) }));
    this.runs.add(run);
    run.finally(() => this.runs.delete(run));
  }

  /**
   * The queues ran dry: one pause of the linger window (waits.ts). False when the window
   * passed with nothing found (or the deadline is near), and the drain stops.
   */
  private async linger(): Promise<boolean> {
    const pause = this.waits.nextPause();
    if (pause === 0) {
      this.stop("empty");
      return false;
    }
    if (this.clock.now() + pause + this.slowestJobMs >= this.deadline) {
      this.stop(this.deadlineReason);
      return false;
    }
    await this.waits.pause(pause);
    this.pool.wakeLanes();
    return !this.stopped;
  }

  /** At the deadline: claiming stops, and the jobs still running are released. */
  private cutAtDeadline(): void {
    const signal = AbortSignal.any([
      this.clock.timeout(this.deadline - this.clock.now()),
      this.ended.signal,
    ]);
    aborted(signal).then(() => {
      if (this.ended.signal.aborted) return;
      this.stop(this.deadlineReason);
      this.pool.cutAll(
        new DOMException(`the drain's deadline came (${this.deadlineReason})`, "AbortError"),
        "release",
      );
    });
  }

  /**
   * The CPU budget: no more claims near the soft limit; near the hard limit, the jobs running
   * are handed back, before the runtime ends the isolate without a word.
   */
  private checkCpu(): void {
    if (this.ended.signal.aborted) return;
    if (this.cpu.mustHandBack()) {
      this.stop("cpu budget");
      this.pool.cutAll(
        new DOMException("the isolate's CPU time is nearly spent", "AbortError"),
        "release",
      );
    } else if (!this.cpu.canClaim()) {
      this.stop("cpu budget");
    }
  }

  /** A signal for one Data API call: its timeout, shorter than the time left until `end`. */
  private callSignal(end = this.isolateEnd): AbortSignal {
    const timeoutMs = this.options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    return this.clock.timeout(Math.min(timeoutMs, end - this.clock.now()));
  }

  /** One complete_and_claim() call: completes `done`, claims up to `maxJobs` of `lane`. */
  private call(lane: Lane, maxJobs: number, done: readonly DoneJob[]): Promise<ClaimedJob[]> {
    this.summary.calls += 1;
    return this.queue.completeAndClaim({
      worker: this.options.workerId,
      done,
      queue: lane.queue,
      kinds: maxJobs > 0 ? lane.kinds : this.kinds,
      maxJobs,
      leaseSeconds: this.leases.seconds(),
      // A claim must answer before the deadline; completions alone, before the isolate ends.
      signal: this.callSignal(maxJobs > 0 ? this.deadline : this.isolateEnd),
    });
  }

  /** Adds the lanes of the queues not drained yet, and checks in for them. */
  private addQueues(queues: readonly string[]): void {
    const added = [...new Set(queues)].filter((queue) => !this.queues.includes(queue));
    for (const queue of added) {
      this.queues.push(queue);
      this.pool.addQueue(queue, this.kinds);
    }
    this.checkIn(added);
  }

  /**
   * Says which kinds this worker claims from `queues` (so `unclaimed` does not list them),
   * next to the first claim rather than before it; a failure is logged and changes nothing.
   */
  private checkIn(queues: readonly string[]): void {
    for (const queue of queues) {
      this.checkins.push(
        this.queue.checkin(this.options.workerId, queue, this.kinds, this.callSignal())
          .catch((error) => {
            this.log({ event: "queue.error", call: "checkin", error: describe(error) });
          }),
      );
    }
  }
}
