// Machinery: one wake-up's work. Claim a batch, run its jobs concurrently, fail the ones that
// threw, and claim the next batch in the same call that completes the ones that ran to the
// end; go on until the queues are empty, then linger: claim again every few tens of
// milliseconds for a while, in case more jobs come, until the window passes with nothing to
// do or the time budget is nearly spent. Completions that no claim took along are sent on
// their own before the drain ends. What a handler returns rides along with its completion as
// the job's result, once checked against the database's size limit.
import type { HandlerMap, Job } from "./job.ts";
import { PermanentError } from "./job.ts";
import {
  type ClaimedJob,
  type DoneJob,
  type Json,
  MAX_RESULT_BYTES,
  QueueError,
  TOO_BIG,
  type WorkerQueue,
} from "./queue.ts";

export interface DrainOptions {
  queue: WorkerQueue;
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
  /**
   * Failed attempts that moved their job to the dead letters (with a permanent error, a
   * result too large to store, or their last attempt).
   */
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
  let finished: DoneJob[] = [];
  // The largest result the database stores, read when a job first returns one.
  let resultLimit: Promise<number> | undefined;
  const maxResultBytes = () =>
    resultLimit ??= options.queue.maxResultBytes().catch((error) => {
      log({
        event: "queue.error",
        call: "config",
        error: describe(error),
        assumed: { max_result_bytes: MAX_RESULT_BYTES },
      });
      return MAX_RESULT_BYTES;
    });

  function stop(reason: DrainSummary["stoppedBy"]): void {
    stopped = true;
    summary.stoppedBy = reason;
  }

  /** Completes the finished jobs and claims up to `maxJobs` of `queue`, in one call. */
  async function completeAndClaim(queue: string, maxJobs: number): Promise<ClaimedJob[]> {
    const call = () =>
      options.queue.completeAndClaim({
        worker: options.workerId,
        done: finished,
        queue,
        kinds,
        maxJobs,
        leaseSeconds: options.leaseSeconds,
      });
    let jobs: ClaimedJob[];
    try {
      jobs = await call();
    } catch (error) {
      if (!isTooBig(error) || !finished.some(({ result }) => result !== null)) throw error;
      // The database measures a result as it stores it (jsonb), which can be larger than its
      // JSON text (a long array of small numbers is), and then refuses the whole call. So
      // the jobs with a result are reported one at a time, failing the ones refused, and the
      // others go with the claim as usual.
      await completeOneByOne();
      jobs = await call();
    }
    // Only now: if the call failed, they are still to report (again, which is harmless if
    // the call went through after all).
    summary.completed += finished.length;
    finished = [];
    return jobs;
  }

  async function completeOneByOne(): Promise<void> {
    for (const done of finished.filter(({ result }) => result !== null)) {
      try {
        await options.queue.complete(done.job, done.result);
        summary.completed += 1;
      } catch (error) {
        if (!isTooBig(error)) throw error;
        const refused = new ResultError(
          `the database refused the handler's result: ${(error as QueueError).reason}`,
        );
        await reportFailure(done.job, refused, { queue: options.queue, log, summary });
      }
      finished = finished.filter((other) => other !== done);
    }
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
        const ranToTheEnd = await runBatch(jobs, stopAt - now(), {
          ...options,
          maxResultBytes,
          log,
          summary,
        });
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
        jobs: finished.map(({ job }) => job.id),
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

/**
 * A result the database cannot store: not JSON, or over `max_result_bytes`. Running the job
 * again would return the same, so its job goes to the dead letters at once.
 */
export class ResultError extends PermanentError {
  override name = "ResultError";
}

function isTooBig(error: unknown): error is QueueError {
  return error instanceof QueueError && error.code === TOO_BIG;
}

/** What a batch needs besides the drain's options. */
interface BatchContext extends DrainOptions {
  maxResultBytes: () => Promise<number>;
  log: (event: LogEvent) => void;
  summary: DrainSummary;
}

type Outcome = { job: ClaimedJob; ok: true; result: Json } | {
  job: ClaimedJob;
  ok: false;
  error: unknown;
};

/** Runs the batch and reports its failures; returns the jobs that ran to the end. */
async function runBatch(
  jobs: ClaimedJob[],
  timeLeftMs: number,
  context: BatchContext,
): Promise<DoneJob[]> {
  const limitMs = Math.max(Math.round(timeLeftMs), 0);
  const signal = AbortSignal.timeout(limitMs);
  const outcomes = await Promise.all(
    jobs.map((job) => runJob(job, signal, limitMs, context)),
  );

  // One failure at a time: each one is a single small UPDATE, and they are rare.
  const done: DoneJob[] = [];
  for (const outcome of outcomes) {
    if (outcome.ok) done.push({ job: outcome.job, result: outcome.result });
    else await reportFailure(outcome.job, outcome.error, context);
  }
  return done;
}

/** fail()s the job: retried later, or dead-lettered when `error` is permanent. */
async function reportFailure(
  job: ClaimedJob,
  error: unknown,
  { queue, log, summary }: Pick<BatchContext, "queue" | "log" | "summary">,
): Promise<void> {
  const retryable = !(error instanceof PermanentError);
  // The place a result was refused is the worker's, not the handler's: no stack.
  const stored = describe(error, !(error instanceof ResultError));
  try {
    const status = await queue.fail(job, stored, retryable);
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

async function runJob(
  job: ClaimedJob,
  signal: AbortSignal,
  limitMs: number,
  { handlers, queue, maxResultBytes, log }: BatchContext,
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
    const returned = await Promise.race([
      handlers[job.kind](job.payload, {
        job: toJob(job),
        signal,
        reportProgress: (progress) => queue.progress(job, progress),
      }),
      abandonedWhenAborted(signal, limitMs),
    ]);
    const result = await toResult(returned, maxResultBytes);
    log({
      event: "job.done",
      ...describeJob(job),
      ms: Math.round(performance.now() - started),
    });
    return { job, ok: true, result };
  } catch (error) {
    return { job, ok: false, error: error ?? new Error("handler threw no error value") };
  }
}

/**
 * What a handler returned, as the JSON stored as its job's result (null: none), or a
 * ResultError that names what is wrong with it. The size is the JSON text's, in UTF-8 bytes;
 * the database measures the stored jsonb and may still refuse a result that passed here
 * (then the worker fails the job as well).
 */
async function toResult(returned: unknown, maxResultBytes: () => Promise<number>): Promise<Json> {
  if (returned === undefined || returned === null) return null;
  let text: string | undefined;
  try {
    text = JSON.stringify(returned);
  } catch (error) {
    throw new ResultError(`the handler's result is not JSON: ${describe(error, false)}`);
  }
  if (text === undefined) {
    throw new ResultError(`the handler's result is not JSON: a ${typeof returned}`);
  }
  const limit = await maxResultBytes();
  const bytes = new TextEncoder().encode(text).length;
  if (bytes > limit) {
    throw new ResultError(
      `the handler's result is ${bytes} bytes of JSON; the limit is ${limit} ` +
        "(max_result_bytes): return less, or store it elsewhere (e.g. Supabase Storage) " +
        "and return a reference",
    );
  }
  // Parsed back: the result as stored, detached from anything the handler still holds.
  return JSON.parse(text);
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
    concurrencyKey: job.concurrency_key,
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
