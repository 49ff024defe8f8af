// Machinery: one wake-up's work. Claim a batch, run its jobs concurrently, fail the ones that
// threw, and claim the next batch in the same call that completes the ones that ran to the
// end; go on until the queues are empty, then linger: claim again every few tens of
// milliseconds for a while, in case more jobs come, until the window passes with nothing to
// do or the time budget is nearly spent. Completions that no claim took along are sent on
// their own before the drain ends.
import type { HandlerMap, Job } from "./job.ts";
import { PermanentError } from "./job.ts";
import type { ClaimedJob, Queue } from "./queue.ts";

export interface DrainOptions {
  queue: Queue;
  handlers: HandlerMap;
  /** Recorded on each claimed job (locked_by). */
  workerId: string;
  batchSize: number;
  /** The lease claims ask for; without it, the lease configured in the database. */
  leaseSeconds?: number;
  /** Stop claiming once this much time has passed (or is about to). */
  timeBudgetMs: number;
  /** Go on claiming for this long after the queues ran dry (default 0: stop at once). */
  lingerMs?: number;
  /** How often to claim while lingering (default 100 ms). */
  lingerPollMs?: number;
  /** Milliseconds on a monotonic clock; tests pass their own. */
  now?: () => number;
  /** Waits `ms` on that clock, or less if `signal` aborts first; tests pass their own. */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  log?: (event: LogEvent) => void;
}

export type LogEvent = { event: string } & Record<string, unknown>;

export interface DrainSummary {
  /** The wake-ups this drain served: the one that started it and those that joined it. */
  wakeUps: number;
  claimed: number;
  /**
   * Jobs that ran to the end and were reported done: along with the next claim, or on their
   * own when the drain ended. (One whose lease was lost meanwhile is counted too; the
   * database leaves it to its new owner.)
   */
  completed: number;
  /** Failed attempts that go back to the queue after a backoff. */
  retried: number;
  /** Failed attempts that moved their job to the dead letters. */
  deadLettered: number;
  /** Failed jobs whose lease was lost (rescued or cancelled) before they were reported. */
  stale: number;
  /** Jobs left running because reporting them failed; the sweeper rescues them. */
  unreported: number;
  /**
   * Why claiming stopped: the queues stayed empty for the whole linger window, the time
   * budget ran out (with jobs waiting, or while lingering), or a call to the API failed.
   */
  stoppedBy: "empty" | "time budget" | "error";
  error?: string;
  elapsedMs: number;
}

/** A drain under way, which later wake-ups for the same queues may join. */
export interface Drain {
  readonly queues: readonly string[];
  /**
   * Hands this drain another wake-up: it claims again at once and starts its linger window
   * over. Taken only while the drain lingers with at least half its time budget left (a busy
   * drain has its hands full, and a wake-up's jobs should not wait for one that is about to
   * stop); false otherwise, and then the wake-up starts a drain of its own.
   */
  join(): boolean;
  readonly done: Promise<DrainSummary>;
}

/** Time kept back at the end of a lease to report the job before the lease runs out. */
const LEASE_MARGIN_MS = 2000;
const DEFAULT_LINGER_POLL_MS = 100;

/** One JSON line per event, which the Edge runtime's logs show as they are. */
export function logJson(event: LogEvent): void {
  console.log(JSON.stringify(event));
}

/** Runs jobs of `queues` (in turn) until they stay empty or time is nearly up. */
export function drain(
  queues: readonly string[],
  options: DrainOptions,
): Promise<DrainSummary> {
  return startDrain(queues, options).done;
}

/** drain(), with a handle that later wake-ups can join. */
export function startDrain(queues: readonly string[], options: DrainOptions): Drain {
  const now = options.now ?? (() => performance.now());
  const sleep = options.sleep ?? abortableSleep;
  const log = options.log ?? logJson;
  const lingerMs = options.lingerMs ?? 0;
  const pollMs = options.lingerPollMs ?? DEFAULT_LINGER_POLL_MS;
  const started = now();
  const deadline = started + options.timeBudgetMs;
  const kinds = Object.keys(options.handlers);
  const woken = [...new Set(queues)];
  const summary: DrainSummary = {
    wakeUps: 1,
    claimed: 0,
    completed: 0,
    retried: 0,
    deadLettered: 0,
    stale: 0,
    unreported: 0,
    stoppedBy: "empty",
    elapsedMs: 0,
  };
  // When the queues were last found dry, while this drain lingers; undefined while it works.
  let drySince: number | undefined;
  let joined = false;
  let stopped = false;
  let interruptPause: AbortController | undefined;
  // Jobs that ran to the end, not yet reported: the next call takes them along.
  let finished: ClaimedJob[] = [];

  function stop(reason: DrainSummary["stoppedBy"]): void {
    stopped = true;
    summary.stoppedBy = reason;
  }

  /** Completes the finished jobs and claims up to `maxJobs` of `queue`, in one call. */
  async function completeAndClaim(queue: string, maxJobs: number): Promise<ClaimedJob[]> {
    const reporting = finished;
    const jobs = await options.queue.completeAndClaim({
      worker: options.workerId,
      done: reporting,
      queue,
      kinds,
      maxJobs,
      leaseSeconds: options.leaseSeconds,
    });
    // Only now: if the call failed, they are still to report (again, which is harmless if
    // the call went through after all).
    finished = [];
    summary.completed += reporting.length;
    return jobs;
  }

  async function run(): Promise<void> {
    // The longest a batch has taken so far: when less time than that is left, another batch
    // might not finish inside the budget, so this wake-up stops claiming.
    let slowestBatchMs = 0;
    let active = woken;
    while (true) {
      if (joined) {
        joined = false;
        drySince = undefined;
        active = woken;
      }
      if (active.length === 0) {
        // Every queue came back empty, or short of a full batch with nothing to report: linger,
        // polling, until the window passes with nothing found.
        drySince ??= now();
        const lingerLeft = drySince + lingerMs - now();
        if (lingerLeft <= 0) return stop("empty");
        const pause = Math.min(pollMs, lingerLeft);
        if (now() + pause + slowestBatchMs >= deadline) return stop("time budget");
        interruptPause = new AbortController();
        await sleep(pause, interruptPause.signal);
        interruptPause = undefined;
        active = woken;
        continue;
      }
      const again: string[] = [];
      for (const queue of active) {
        if (now() + slowestBatchMs >= deadline) return stop("time budget");
        const batchStarted = now();
        const jobs = await completeAndClaim(queue, options.batchSize);
        if (jobs.length === 0) continue;
        drySince = undefined;
        summary.claimed += jobs.length;
        // Handlers are stopped before the budget ends and before their lease does, so each
        // job is reported before the sweeper could hand it to another worker.
        const stopAt = Math.min(deadline, batchStarted + shortestLeaseMs(jobs) - LEASE_MARGIN_MS);
        const ranToTheEnd = await runBatch(jobs, stopAt - now(), options, log, summary);
        finished.push(...ranToTheEnd);
        slowestBatchMs = Math.max(slowestBatchMs, now() - batchStarted);
        // A full batch: more may wait. A short one with jobs to report: they go at once,
        // with one more claim (as cheap as sending them alone), not after a linger pause.
        if (jobs.length === options.batchSize || ranToTheEnd.length > 0) again.push(queue);
      }
      active = again;
    }
  }

  /** Sends the completions that no claim took along (the drain stopped after their batch). */
  async function reportFinished(): Promise<void> {
    if (finished.length === 0) return;
    try {
      await completeAndClaim(woken[0], 0);
    } catch (error) {
      summary.unreported += finished.length;
      log({
        event: "queue.error",
        call: "complete_and_claim",
        jobs: finished.map((job) => job.id),
        error: describe(error),
      });
    }
  }

  // Say which kinds this worker claims (so `unclaimed` does not list them), next to the
  // first claim rather than before it; a failure is logged and changes nothing else.
  const checkedIn = Promise.all(
    woken.map((queue) =>
      options.queue.checkin(options.workerId, queue, kinds).catch((error) => {
        log({ event: "queue.error", call: "checkin", error: describe(error) });
      })
    ),
  );

  const done = (async () => {
    try {
      await run();
    } catch (error) {
      stop("error");
      summary.error = describe(error);
    }
    // Part of the drain's work (what the Edge runtime waits for): once that settles, the
    // function may be shut down, and completions not sent by then would be lost.
    await reportFinished();
    await checkedIn;
    summary.elapsedMs = Math.round(now() - started);
    return summary;
  })();

  return {
    queues: woken,
    done,
    join() {
      const lingering = drySince !== undefined;
      if (stopped || !lingering || now() - started > options.timeBudgetMs / 2) return false;
      summary.wakeUps += 1;
      joined = true;
      interruptPause?.abort();
      return true;
    },
  };
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

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", cut);
      resolve();
    }, ms);
    const cut = () => {
      clearTimeout(timer);
      resolve();
    };
    signal.addEventListener("abort", cut, { once: true });
  });
}

type Outcome = { job: ClaimedJob; error?: unknown };

/** Runs the batch and reports its failures; returns the jobs that ran to the end. */
async function runBatch(
  jobs: ClaimedJob[],
  timeLeftMs: number,
  options: DrainOptions,
  log: (event: LogEvent) => void,
  summary: DrainSummary,
): Promise<ClaimedJob[]> {
  const limitMs = Math.max(Math.round(timeLeftMs), 0);
  const signal = AbortSignal.timeout(limitMs);
  const outcomes = await Promise.all(
    jobs.map((job) => runJob(job, signal, limitMs, options.handlers, log)),
  );

  // One failure at a time: each one is a single small UPDATE, and they are rare.
  for (const { job, error } of outcomes) {
    if (error === undefined) continue;
    const retryable = !(error instanceof PermanentError);
    try {
      const status = await options.queue.fail(job, describe(error), retryable);
      if (status === "queued") summary.retried += 1;
      else if (status === "failed") summary.deadLettered += 1;
      else summary.stale += 1;
      log({
        event: status === null ? "job.stale" : `job.${status}`,
        ...describeJob(job),
        error: describe(error, false),
      });
    } catch (queueError) {
      summary.unreported += 1;
      log({ event: "queue.error", call: "fail", error: describe(queueError) });
    }
  }
  return outcomes.filter((o) => o.error === undefined).map((o) => o.job);
}

async function runJob(
  job: ClaimedJob,
  signal: AbortSignal,
  limitMs: number,
  handlers: HandlerMap,
  log: (event: LogEvent) => void,
): Promise<Outcome> {
  const started = performance.now();
  try {
    // Only the kinds in `handlers` are claimed, so this is a safety net.
    if (!Object.hasOwn(handlers, job.kind)) {
      throw new PermanentError(
        `no handler for job kind "${job.kind}": add handlers/${job.kind}.ts and ` +
          "register it in handlers/mod.ts",
      );
    }
    // A handler that ignores the signal is abandoned when it fires, so one stuck job
    // cannot keep the batch's other jobs from being reported.
    await Promise.race([
      handlers[job.kind](job.payload, { job: toJob(job), signal }),
      abandonedWhenAborted(signal, limitMs),
    ]);
    log({
      event: "job.done",
      ...describeJob(job),
      ms: Math.round(performance.now() - started),
    });
    return { job };
  } catch (error) {
    return { job, error: error ?? new Error("handler threw no error value") };
  }
}

function abandonedWhenAborted(signal: AbortSignal, limitMs: number): Promise<never> {
  return new Promise((_resolve, reject) => {
    const abandon = () => {
      const error = new Error(
        `the job was still running after ${limitMs} ms, when this wake-up's time budget ` +
          "(or the job's lease) ran out; it will be retried",
      );
      error.name = "TimeoutError";
      reject(error);
    };
    if (signal.aborted) abandon();
    else signal.addEventListener("abort", abandon, { once: true });
  });
}

function toJob(job: ClaimedJob): Job {
  return {
    id: job.id,
    kind: job.kind,
    queue: job.queue,
    attempt: job.attempts,
    maxAttempts: job.max_attempts,
  };
}

function describeJob(job: ClaimedJob) {
  return { id: job.id, kind: job.kind, attempt: job.attempts };
}

/** The text stored as the job's last_error: the message, and where it was thrown. */
export function describe(error: unknown, withStack = true): string {
  if (error instanceof Error) {
    const head = `${error.name}: ${error.message}`;
    return withStack && error.stack ? error.stack : head;
  }
  if (typeof error === "string") return error;
  try {
    return JSON.stringify(error) ?? String(error);
  } catch {
    return String(error);
  }
}
