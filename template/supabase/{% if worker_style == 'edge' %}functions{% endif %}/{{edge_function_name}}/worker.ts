// Machinery: one wake-up's work. Claim a batch, run its jobs concurrently, complete or fail
// each one, and go on until the queues are empty or the time budget is nearly spent.
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
  /** Milliseconds on a monotonic clock; tests pass their own. */
  now?: () => number;
  log?: (event: LogEvent) => void;
}

export type LogEvent = { event: string } & Record<string, unknown>;

export interface DrainSummary {
  claimed: number;
  completed: number;
  /** Failed attempts that go back to the queue after a backoff. */
  retried: number;
  /** Failed attempts that moved their job to the dead letters. */
  deadLettered: number;
  /** Jobs whose lease was lost (rescued or cancelled) before they were reported. */
  stale: number;
  /** Jobs left running because reporting them failed; the sweeper rescues them. */
  unreported: number;
  /** Why claiming stopped. */
  stoppedBy: "empty" | "time budget" | "error";
  error?: string;
  elapsedMs: number;
}

/** Time kept back at the end of a lease to report the job before the lease runs out. */
const LEASE_MARGIN_MS = 2000;

/** One JSON line per event, which the Edge runtime's logs show as they are. */
export function logJson(event: LogEvent): void {
  console.log(JSON.stringify(event));
}

/** Runs jobs of `queues` (in turn) until they are empty or time is nearly up. */
export async function drain(
  queues: readonly string[],
  options: DrainOptions,
): Promise<DrainSummary> {
  const now = options.now ?? (() => performance.now());
  const log = options.log ?? logJson;
  const started = now();
  const deadline = started + options.timeBudgetMs;
  const kinds = Object.keys(options.handlers);
  const summary: DrainSummary = {
    claimed: 0,
    completed: 0,
    retried: 0,
    deadLettered: 0,
    stale: 0,
    unreported: 0,
    stoppedBy: "empty",
    elapsedMs: 0,
  };
  // The longest a batch has taken so far: when less time than that is left, another batch
  // might not finish inside the budget, so this wake-up stops claiming.
  let slowestBatchMs = 0;
  let active = [...new Set(queues)];

  try {
    while (active.length > 0) {
      const stillFull: string[] = [];
      for (const queue of active) {
        if (now() + slowestBatchMs >= deadline) {
          summary.stoppedBy = "time budget";
          return summary;
        }
        const batchStarted = now();
        const jobs = await options.queue.claim({
          worker: options.workerId,
          queue,
          kinds,
          maxJobs: options.batchSize,
          leaseSeconds: options.leaseSeconds,
        });
        if (jobs.length === 0) continue;
        summary.claimed += jobs.length;
        // Handlers are stopped before the budget ends and before their lease does, so each
        // job is reported before the sweeper could hand it to another worker.
        const stopAt = Math.min(deadline, batchStarted + shortestLeaseMs(jobs) - LEASE_MARGIN_MS);
        await runBatch(jobs, stopAt - now(), options, log, summary);
        slowestBatchMs = Math.max(slowestBatchMs, now() - batchStarted);
        if (jobs.length === options.batchSize) stillFull.push(queue);
      }
      active = stillFull;
    }
    return summary;
  } catch (error) {
    summary.stoppedBy = "error";
    summary.error = describe(error);
    return summary;
  } finally {
    summary.elapsedMs = Math.round(now() - started);
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
        `claim() returned job ${job.id} without locked_at and locked_until, which set its ` +
          "time limit: claim() must return whole jobs rows, as the project's migrations have it",
      );
    }
    return leaseMs;
  });
  return Math.min(...leases);
}

type Outcome = { job: ClaimedJob; error?: unknown };

async function runBatch(
  jobs: ClaimedJob[],
  timeLeftMs: number,
  options: DrainOptions,
  log: (event: LogEvent) => void,
  summary: DrainSummary,
): Promise<void> {
  const limitMs = Math.max(Math.round(timeLeftMs), 0);
  const signal = AbortSignal.timeout(limitMs);
  const outcomes = await Promise.all(
    jobs.map((job) => runJob(job, signal, limitMs, options.handlers, log)),
  );

  const done = outcomes.filter((o) => o.error === undefined).map((o) => o.job);
  if (done.length > 0) {
    try {
      const completed = new Set(await options.queue.completeMany(done));
      summary.completed += completed.size;
      for (const job of done.filter((job) => !completed.has(job.id))) {
        summary.stale += 1;
        log({ event: "job.stale", ...describeJob(job) });
      }
    } catch (error) {
      summary.unreported += done.length;
      log({ event: "queue.error", call: "complete_many", error: describe(error) });
    }
  }

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
