// Machinery: a drain, the work of the wake-ups an instance gets. It keeps a pool of slots
// (PGQUEUE_MAX_JOBS_IN_FLIGHT) full: a job that ends frees its slot at once, and the next
// claim fills it, completing the jobs that ran to the end in the same call; the ones that threw
// are failed. Each claim asks for a short lease (at most PGQUEUE_LEASE_SECONDS, never longer
// than the isolate has left), renewed with heartbeat_many() while its jobs run, so the jobs of
// an isolate killed without warning are claimable again within about a minute. Kinds declared
// CPU-heavy run alone, a few per isolate, and the drain stops claiming when the isolate's CPU
// time nears the runtime's soft limit, and hands back what it holds before the hard one
// (cpu.ts). When the queues run dry it lingers: it claims again after 100 ms, then after
// twice as long each time, until the window passes with nothing found or the deadline is near;
// a wake-up that comes meanwhile joins the drain. The deadline is the earlier of the time
// budget and the isolate's own wall-clock limit (less a margin): at the deadline, or when the
// runtime unloads the function (`beforeunload`), claiming stops and the jobs still running are
// released (their attempt not counted, unless it is the job's third release in a row);
// completions that no claim took along are sent before the drain ends. (Each job's run:
// run_job.ts; how each job's end is reported: report.ts.)
import { type Clock, systemClock } from "./clock.ts";
import { CpuBudget, uncountedMeter } from "./cpu.ts";
import { jobLog, type LogEvent, logJson, type LogLevel } from "./log.ts";
import type { HandlerMap } from "./job.ts";
import type { ClaimedJob, DoneJob, WorkerQueue } from "./queue.ts";
import { JobOwners } from "./owners.ts";
import { type CutAs, type ReportCounts, Reporter } from "./report.ts";
import { describe, type JobRunContext, runJob } from "./run_job.ts";

export interface DrainOptions {
  queue: WorkerQueue;
  handlers: HandlerMap;
  /** Recorded on each claimed job (locked_by). */
  workerId: string;
  /** The most jobs one claim takes. */
  batchSize: number;
  /** The slots: the most jobs running at once (default: batchSize). */
  maxJobsInFlight?: number;
  /** The longest lease a claim asks for (default 60 s), renewed while its jobs run. */
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
  /** The first pause while lingering; each next one is twice as long. */
  lingerPollMs: number;
  /** The isolate's CPU budget (cpu.ts), shared by its drains; default: none counted. */
  cpu?: CpuBudget;
  clock?: Clock;
  log?: (event: LogEvent) => void;
  /** "debug" logs a line per job too (log.ts). */
  logLevel?: LogLevel;
}

/** What a drain did; the counts of its jobs' ends are ReportCounts' (report.ts). */
export interface DrainSummary extends ReportCounts {
  /** The wake-ups this drain served: the one that started it and those that joined it. */
  wakeUps: number;
  /** complete_and_claim() calls made. */
  calls: number;
  /** heartbeat_many() calls made. */
  heartbeats: number;
  claimed: number;
  /**
   * Why claiming stopped: the queues stayed empty for the whole linger window, the time
   * budget ran out, the isolate's wall-clock limit was near, its CPU time was nearly spent,
   * the runtime unloaded the function, or a call to the API failed.
   */
  stoppedBy: "empty" | "time budget" | "wall-clock limit" | "cpu budget" | "unload" | "error";
  /** The runtime's reason for unloading (beforeunload's detail.reason), when it said one. */
  unloadReason?: string;
  error?: string;
  elapsedMs: number;
  /** The CPU time the meter counted while the drain ran (cpu.ts), in ms. */
  cpuMs: number;
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
  unload(reason?: string): void;
  readonly done: Promise<DrainSummary>;
}

/** The share of the wall-clock limit kept back to release and report what is in hand. */
const WALL_CLOCK_MARGIN = 0.1;
/** Time kept back at the end of a lease to report the job before the lease runs out. */
const LEASE_MARGIN_MS = 2000;
/** Time kept back at the isolate's end: completions are tried again until then, no later. */
const REPORT_MARGIN_MS = 1000;
const DEFAULT_CALL_TIMEOUT_MS = 10_000;
/** The longest lease a claim asks for when the worker sets none. */
export const DEFAULT_LEASE_SECONDS = 60;
/** Leases are renewed three times per lease, so one failed renewal loses nothing. */
const RENEWALS_PER_LEASE = 3;
/**
 * While jobs run, a claim waits until half the slots are free, or this long after it could
 * have filled one: a call costs the isolate about 1 ms of CPU time, so jobs that end together
 * are refilled by one call, not one each, and a slot is never idle longer than this.
 */
const REFILL_WAIT_MS = 20;

/** Starts draining `queues`; see Drain. */
export function startDrain(queues: readonly string[], options: DrainOptions): Drain {
  return new QueueDrain(queues, options);
}

/** Claims of one queue: of its light kinds (as many as slots are free), or of its heavy ones. */
interface Lane {
  queue: string;
  kinds: string[];
  heavy: boolean;
  /** Worth a claim: its last one was full, or one of its jobs ended since. */
  active: boolean;
}

/** A job running in a slot. */
interface Slot {
  job: ClaimedJob;
  lane: Lane;
  /** When its lease runs out (on the drain's clock), as last renewed. */
  leaseEnd: number;
  claimedAt: number;
  cut: AbortController;
  /** Why it was cut off, once it was: what becomes of it (report.ts). */
  cutAs?: CutAs;
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
  private readonly started: number;
  private readonly cpuAtStart: number;
  /** When claiming stops and running handlers are cut off; and why then. */
  private readonly deadline: number;
  private readonly deadlineReason: "time budget" | "wall-clock limit";
  /** When the platform ends the isolate: the last reports must be sent by then. */
  private readonly isolateEnd: number;
  private readonly slots: number;
  private readonly lanes: Lane[] = [];
  private turn = 0;
  private readonly running = new Map<number, Slot>();
  // Each job's run up to its report, which the drain's end waits for.
  private readonly runs = new Set<Promise<void>>();
  // The longest a job has taken, from its claim to its end: when less time is left, another
  // job might not end before the deadline, so the drain stops claiming.
  private slowestJobMs = 0;
  // When the queues were last found dry, while this drain lingers; undefined while it works.
  private drySince: number | undefined;
  private nextPauseMs: number;
  private stopped = false;
  private readonly ended = new AbortController();
  private interruptPause: AbortController | undefined;
  // Since when a free slot waits for more to free up before a claim fills them.
  private refillSince: number | undefined;
  // Wakes the claim loop while it waits for a slot: a job ended, a wake-up joined, a stop.
  private waiter: (() => void) | undefined;
  private kicked = false;
  private readonly reporter: Reporter;
  private readonly checkins: Promise<void>[] = [];
  private readonly owners: JobOwners;
  private readonly context: JobRunContext;

  constructor(queues: readonly string[], options: DrainOptions) {
    this.options = options;
    this.clock = options.clock ?? systemClock;
    this.log = options.log ?? logJson;
    this.kinds = Object.keys(options.handlers);
    this.cpu = options.cpu ?? new CpuBudget(uncountedMeter, NO_CPU_LIMITS);
    this.started = this.clock.now();
    this.cpuAtStart = this.cpu.meter.busyMs();
    const limitMs = options.wallClockLimitMs;
    this.isolateEnd = (options.isolateStartedAt ?? this.started) + limitMs;
    const budgetEnd = this.started + options.timeBudgetMs;
    const isolateDeadline = this.isolateEnd - limitMs * WALL_CLOCK_MARGIN;
    this.deadline = Math.min(budgetEnd, isolateDeadline);
    this.deadlineReason = budgetEnd <= isolateDeadline ? "time budget" : "wall-clock limit";
    this.slots = options.maxJobsInFlight ?? options.batchSize;
    this.nextPauseMs = options.lingerPollMs;
    const jobLines = jobLog(this.log, options.logLevel);
    this.reporter = new Reporter({
      queue: options.queue,
      counts: this.summary,
      log: this.log,
      jobLog: jobLines,
      callSignal: () => this.callSignal(),
      clock: this.clock,
    });
    this.context = {
      handlers: options.handlers,
      queue: options.queue,
      clock: this.clock,
      jobLog: jobLines,
      meter: this.cpu.meter,
      maxResultBytes: () => this.reporter.maxResultBytes(),
      callSignal: () => this.callSignal(),
    };
    this.addQueues(queues);
    this.owners = new JobOwners(options.queue, this.callSignal(), this.log);
    this.done = this.run();
  }

  join(queues: readonly string[]): boolean {
    if (this.stopped) return false;
    this.addQueues(queues);
    this.summary.wakeUps += 1;
    // The linger window starts over.
    this.drySince = undefined;
    this.nextPauseMs = this.options.lingerPollMs;
    this.wakeLanes();
    this.interruptPause?.abort();
    this.kick();
    return true;
  }

  unload(reason?: string): void {
    if (this.stopped && this.summary.stoppedBy === "unload") return;
    this.stop("unload");
    if (reason !== undefined) this.summary.unloadReason = reason;
    this.interruptPause?.abort();
    this.cutAll(new DOMException("the function is being unloaded", "AbortError"), "release");
  }

  private async run(): Promise<DrainSummary> {
    const stopWatchingCpu = this.cpu.meter.onBusy(() => this.checkCpu());
    const renewing = this.renewLeases();
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
      (done) => this.call(this.lanes[0], 0, done),
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
    this.kick();
  }

  /** Fills free slots, lingering when the queues run dry, until it should stop claiming. */
  private async claimUntilDone(): Promise<void> {
    while (!this.stopped) {
      this.checkCpu();
      if (this.stopped) return;
      if (this.clock.now() + this.slowestJobMs >= this.deadline) {
        return this.stop(this.deadlineReason);
      }
      const lane = this.nextLane();
      if (lane !== undefined && this.refillNow(lane)) await this.claim(lane);
      else if (lane !== undefined) await this.nextEvent(this.refillSince! + REFILL_WAIT_MS);
      else if (this.running.size > 0) await this.nextEvent();
      else if (!(await this.linger())) return;
    }
  }

  /**
   * The next lane, in turn, that can claim now; undefined when none can. A heavy lane claims
   * only into an empty pool: when its turn comes, the light lanes wait until the pool empties.
   */
  private nextLane(): Lane | undefined {
    for (let i = 0; i < this.lanes.length; i++) {
      const index = (this.turn + i) % this.lanes.length;
      const lane = this.lanes[index];
      if (!lane.active) continue;
      if (lane.heavy && !this.cpu.canStartHeavy()) {
        lane.active = false;
        continue;
      }
      if (lane.heavy ? this.running.size > 0 : this.freeSlots() === 0) return undefined;
      this.turn = (index + 1) % this.lanes.length;
      return lane;
    }
    return undefined;
  }

  /**
   * Whether to claim for `lane` now: into an empty pool, for a heavy lane, once half the slots
   * are free, or once a free slot has waited REFILL_WAIT_MS for others.
   */
  private refillNow(lane: Lane): boolean {
    const halfTheSlots = Math.ceil(Math.min(this.slots, this.options.batchSize) / 2);
    if (lane.heavy || this.running.size === 0 || this.freeSlots() >= halfTheSlots) {
      this.refillSince = undefined;
      return true;
    }
    this.refillSince ??= this.clock.now();
    if (this.clock.now() < this.refillSince + REFILL_WAIT_MS) return false;
    this.refillSince = undefined;
    return true;
  }

  /** Free slots; none while a heavy job runs (it runs alone). */
  private freeSlots(): number {
    for (const slot of this.running.values()) if (slot.lane.heavy) return 0;
    return this.slots - this.running.size;
  }

  /** One claim for `lane`, completing the jobs that ended; starts each job it took. */
  private async claim(lane: Lane): Promise<void> {
    const wanted = lane.heavy ? 1 : Math.min(this.options.batchSize, this.freeSlots());
    const claimedAt = this.clock.now();
    const jobs = await this.reporter.completeWith((done) => this.call(lane, wanted, done));
    if (jobs.length < wanted) lane.active = false;
    if (jobs.length === 0) return;
    this.drySince = undefined;
    this.nextPauseMs = this.options.lingerPollMs;
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
    this.running.set(job.id, slot);
    this.cpu.meter.watch(true);
    const heavyEnded = lane.heavy ? this.cpu.startHeavy() : undefined;
    const cpuBefore = this.cpu.meter.busyMs();
    const run = runJob(job, slot.cut.signal, this.context).then(async (outcome) => {
      this.running.delete(job.id);
      if (this.running.size === 0) this.cpu.meter.watch(false);
      heavyEnded?.(this.cpu.meter.busyMs() - cpuBefore);
      if (slot.cutAs === undefined) {
        this.slowestJobMs = Math.max(this.slowestJobMs, this.clock.now() - claimedAt);
      }
      lane.active = true;
      // Recorded before the claim loop wakes, so that its next call takes the job along.
      const reported = this.reporter.record(outcome, slot.cutAs ?? "fail", slot.leaseEnd);
      this.checkCpu();
      this.kick();
      await reported;
    });
    this.runs.add(run);
    run.finally(() => this.runs.delete(run));
  }

  /**
   * The queues ran dry: one pause of the linger window, twice as long as the one before. False
   * when the window passed with nothing found (or the deadline is near), and the drain stops.
   */
  private async linger(): Promise<boolean> {
    const lingerMs = this.options.lingerMs ?? 0;
    this.drySince ??= this.clock.now();
    const lingerLeft = this.drySince + lingerMs - this.clock.now();
    if (lingerLeft <= 0) {
      this.stop("empty");
      return false;
    }
    const pause = Math.min(this.nextPauseMs, lingerLeft);
    if (this.clock.now() + pause + this.slowestJobMs >= this.deadline) {
      this.stop(this.deadlineReason);
      return false;
    }
    // (Before the pause: a wake-up that joins during it starts the pauses over.)
    this.nextPauseMs *= 2;
    this.interruptPause = new AbortController();
    await this.clock.sleep(pause, this.interruptPause.signal);
    this.interruptPause = undefined;
    this.wakeLanes();
    return !this.stopped;
  }

  /** Renews the leases of the jobs running, three times per lease, until the drain ends. */
  private async renewLeases(): Promise<void> {
    const everyMs = (1000 * this.leaseCap()) / RENEWALS_PER_LEASE;
    while (!this.ended.signal.aborted) {
      await aborted(AbortSignal.any([this.clock.timeout(everyMs), this.ended.signal]));
      if (this.ended.signal.aborted) return;
      if (this.running.size > 0) await this.renew(everyMs);
    }
  }

  /**
   * One heartbeat_many() for every job running: a job it no longer lists lost its lease
   * (cancelled, or rescued) and is stopped. When the call fails, a job whose lease would run
   * out before the next renewal is stopped in time to be reported (failed: retried later).
   */
  private async renew(everyMs: number): Promise<void> {
    const slots = [...this.running.values()];
    const leaseSeconds = this.leaseSeconds();
    const asked = this.clock.now();
    try {
      this.summary.heartbeats += 1;
      const jobs = slots.map(({ job }) => job);
      const held = new Set(
        await this.options.queue.heartbeatMany(jobs, leaseSeconds, this.callSignal()),
      );
      for (const slot of slots) {
        if (held.has(slot.job.id)) {
          slot.leaseEnd = Math.max(slot.leaseEnd, asked + 1000 * leaseSeconds);
        } else {
          this.cut(slot, new Error("the job's lease was lost (cancelled or rescued)"), "lost");
        }
      }
    } catch (error) {
      this.log({ event: "queue.error", call: "heartbeat_many", error: describe(error) });
      const now = this.clock.now();
      for (const slot of slots) {
        if (slot.leaseEnd - LEASE_MARGIN_MS <= now + everyMs) {
          const ranMs = Math.round(now - slot.claimedAt);
          const cause = new Error(
            `the job's lease could not be renewed and was about to run out after ${ranMs} ms ` +
              `(${describe(error, false)}); it will be retried`,
          );
          cause.name = "TimeoutError";
          this.cut(slot, cause, "fail");
        }
      }
    }
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
      this.cutAll(
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
      this.cutAll(
        new DOMException("the isolate's CPU time is nearly spent", "AbortError"),
        "release",
      );
    } else if (!this.cpu.canClaim()) {
      this.stop("cpu budget");
    }
  }

  private cutAll(reason: unknown, as: CutAs): void {
    for (const slot of this.running.values()) this.cut(slot, reason, as);
  }

  private cut(slot: Slot, reason: unknown, as: CutAs): void {
    if (slot.cut.signal.aborted) return;
    slot.cutAs = as;
    slot.cut.abort(reason);
  }

  /** The lease a claim or renewal asks for: the cap, never longer than the isolate has left. */
  private leaseSeconds(): number {
    const leftSeconds = Math.floor((this.isolateEnd - this.clock.now()) / 1000);
    return Math.max(Math.min(this.leaseCap(), leftSeconds), 1);
  }

  private leaseCap(): number {
    return this.options.leaseSeconds ?? DEFAULT_LEASE_SECONDS;
  }

  /** A signal for one Data API call: its timeout, shorter than the time left until `end`. */
  private callSignal(end = this.isolateEnd): AbortSignal {
    const timeoutMs = this.options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    return this.clock.timeout(Math.min(timeoutMs, end - this.clock.now()));
  }

  /** One complete_and_claim() call: completes `done`, claims up to `maxJobs` of `lane`. */
  private call(lane: Lane, maxJobs: number, done: readonly DoneJob[]): Promise<ClaimedJob[]> {
    this.summary.calls += 1;
    return this.options.queue.completeAndClaim({
      worker: this.options.workerId,
      done,
      queue: lane.queue,
      kinds: maxJobs > 0 ? lane.kinds : this.kinds,
      maxJobs,
      leaseSeconds: this.leaseSeconds(),
      // A claim must answer before the deadline; completions alone, before the isolate ends.
      signal: this.callSignal(maxJobs > 0 ? this.deadline : this.isolateEnd),
    });
  }

  /** Adds the lanes of the queues not drained yet, and checks in for them. */
  private addQueues(queues: readonly string[]): void {
    const added = [...new Set(queues)].filter((queue) => !this.queues.includes(queue));
    const { light, heavy } = this.cpu.split(this.kinds);
    for (const queue of added) {
      this.queues.push(queue);
      if (light.length > 0) this.lanes.push({ queue, kinds: light, heavy: false, active: true });
      if (heavy.length > 0) this.lanes.push({ queue, kinds: heavy, heavy: true, active: true });
    }
    this.checkIn(added);
  }

  /** Every lane is worth a claim again (the linger's next poll, or a wake-up). */
  private wakeLanes(): void {
    for (const lane of this.lanes) lane.active = true;
  }

  /** Waits until a job ends, a wake-up joins, the drain stops, or `until` comes. */
  private nextEvent(until?: number): Promise<void> {
    if (this.kicked) {
      this.kicked = false;
      return Promise.resolve();
    }
    const woken = new Promise<void>((resolve) => this.waiter = resolve);
    if (until === undefined) return woken;
    const timer = this.clock.timeout(until - this.clock.now());
    return Promise.race([woken, aborted(timer)]).then(() => {
      this.waiter = undefined;
    });
  }

  private kick(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    if (waiter === undefined) this.kicked = true;
    else waiter();
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

/** No CPU limit: the budget of a drain given none. */
const NO_CPU_LIMITS = {
  softLimitMs: Infinity,
  hardLimitMs: Infinity,
  heavyKinds: [],
  heavyPerIsolate: 0,
};

/** Resolves once `signal` aborts. */
function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/**
 * The lease the claim gave this job, from its row: the database's clock set both ends, so the
 * difference holds whatever this machine's clock says.
 */
function leaseMsOf(job: ClaimedJob): number {
  const leaseMs = Date.parse(job.locked_until) - Date.parse(job.locked_at);
  if (!Number.isFinite(leaseMs)) {
    throw new Error(
      `complete_and_claim() returned job ${job.id} without locked_at and locked_until, ` +
        "which set its time limit: apply the project's migrations to the database",
    );
  }
  return leaseMs;
}
