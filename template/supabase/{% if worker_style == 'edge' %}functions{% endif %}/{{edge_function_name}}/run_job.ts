// Machinery: running one job in a slot of a drain (worker.ts). The handler is called with the
// job's signal and abandoned when that fires (the drain's deadline, its CPU budget, the
// function's unloading, or the job's lease lost), so a stuck handler frees its slot; its code
// may still run on, as JavaScript cannot be stopped from outside, but nothing it does counts.
// What it returns is checked (JSON, within the database's max_result_bytes) before it rides
// along with the completion; how the run ended is returned, for the drain to complete, fail or
// release the job.
import type { Job } from "./job.ts";
import { type HandlerMap, PermanentError } from "./job.ts";
import {
  Dependencies,
  dependenciesFromRows,
  NO_DEPENDENCIES,
  takeDependencies,
} from "./dependencies.ts";
import type { ClaimedJob, Json, WorkerQueue } from "./queue.ts";
import type { Clock } from "./clock.ts";
import type { LogEvent } from "./log.ts";
import type { CpuMeter } from "./cpu.ts";

/**
 * A result the database cannot store: not JSON, or over `max_result_bytes`. Running the job
 * again would return the same, so its job goes to the dead letters at once.
 */
export class ResultError extends PermanentError {
  override name = "ResultError";
}

/** What running one job needs from its drain. */
export interface JobRunContext {
  handlers: HandlerMap;
  queue: WorkerQueue;
  clock: Clock;
  /** Where the per-job lines go (job.done): log.ts's jobLog(). */
  jobLog: (event: LogEvent) => void;
  /** Counts the time the handler holds the thread when called. */
  meter: CpuMeter;
  maxResultBytes: () => Promise<number>;
  /** A signal for one Data API call (a progress report). */
  callSignal: () => AbortSignal;
}

/** How a job's run ended; `cut`: the job's signal had fired when it did. */
export type Outcome = { job: ClaimedJob; ok: true; result: Json } | {
  job: ClaimedJob;
  ok: false;
  error: unknown;
  cut: boolean;
};

export async function runJob(
  job: ClaimedJob,
  signal: AbortSignal,
  { handlers, queue, clock, maxResultBytes, jobLog, callSignal, meter }: JobRunContext,
): Promise<Outcome> {
  const started = clock.now();
  try {
    // Only the kinds in `handlers` are claimed, so this is a safety net.
    if (!Object.hasOwn(handlers, job.kind)) {
      throw new PermanentError(
        `no handler for job kind "${job.kind}": add handlers/${job.kind}.ts and ` +
          "register it in handlers/mod.ts",
      );
    }
    let { payload, dependencies } = handlerInput(job);
    if (dependencies.resultsOmitted) {
      const rows = await queue.dependencyResults(job.id, callSignal());
      dependencies = dependenciesFromRows(rows, true);
    }
    // A handler that ignores the signal is abandoned when it fires, so one stuck job
    // cannot hold its slot past the drain's deadline or its lease.
    const returned = await Promise.race([
      meter.hold(() =>
        handlers[job.kind](payload, {
          job: toJob(job, dependencies),
          signal,
          reportProgress: (progress) => queue.progress(job, progress, callSignal()),
        })
      ),
      abandonedWhenAborted(signal),
    ]);
    const result = await toResult(returned, maxResultBytes);
    jobLog({
      event: "job.done",
      ...describeJob(job),
      ms: Math.round(clock.now() - started),
    });
    return { job, ok: true, result };
  } catch (error) {
    return {
      job,
      ok: false,
      error: error ?? new Error("handler threw no error value"),
      cut: signal.aborted,
    };
  }
}

/**
 * The payload the handler of `job` is given, without `_dependencies`, and what they ended
 * with (their results still to fetch when the queue left them out: `resultsOmitted`).
 * Malformed dependencies fail the job for good.
 */
function handlerInput(job: ClaimedJob): { payload: unknown; dependencies: Dependencies } {
  try {
    return takeDependencies(job.payload);
  } catch (error) {
    throw new PermanentError(`invalid payload for ${job.kind}: ${describe(error, false)}`);
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

/** Rejects with the signal's reason (the drain's, which says why) once it aborts. */
function abandonedWhenAborted(signal: AbortSignal): Promise<never> {
  return new Promise((_resolve, reject) => {
    const abandon = () => reject(signal.reason);
    if (signal.aborted) abandon();
    else signal.addEventListener("abort", abandon, { once: true });
  });
}

export function toJob(job: ClaimedJob, dependencies = NO_DEPENDENCIES): Job {
  return {
    id: job.id,
    kind: job.kind,
    queue: job.queue,
    attempt: job.attempts,
    maxAttempts: job.max_attempts,
    concurrencyKey: job.concurrency_key,
    owner: job.owner ?? null,
    dependencies,
  };
}

export function describeJob(job: ClaimedJob) {
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
