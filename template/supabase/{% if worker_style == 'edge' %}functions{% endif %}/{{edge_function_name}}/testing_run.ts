// Test helper (exported by testing.ts for your handlers' tests): runs one handler the way the
// worker would, with no database and no Data API.
//
//   const ran = await runJob("send_email", { to: "ada@example.com", subject: "Hi", text: "." });
//   assert.equal(ran.result, null);
//
// The handler registered for the kind in handlers/mod.ts runs (or one of the `handlers` you
// pass) on the payload as the queue stores it (JSON), with a made-up job (`job` changes any of
// its fields), its progress reports kept in order, and its result checked as the worker checks
// it (JSON, within max_result_bytes). What the handler throws, runJob() rejects with
// (PermanentError, RetryAfter, any error), so `assert.rejects` tells what the worker would do
// with the job; a handler still running after `timeoutMs` rejects with HandlerTimedOut.
// jobContext() is a bare context, to call a handler yourself.
import type { HandlerMap, Job, JobContext } from "./job.ts";
import { type Dependencies, NO_DEPENDENCIES } from "./dependencies.ts";
import { handlers as projectHandlers } from "./handlers/mod.ts";
import { type ClaimedJob, type Json, MAX_RESULT_BYTES, type WorkerQueue } from "./queue.ts";
import { runJob as runInSlot } from "./run_job.ts";
import { systemClock } from "./clock.ts";
import type { CpuMeter } from "./cpu.ts";

/** How long runJob() lets a handler run unless told: 10 s. */
export const DEFAULT_TEST_TIMEOUT_MS = 10_000;

/**
 * The handler was still running after its timeout: in the function, the drain's deadline (or
 * its lease) would cut it off the same way, through its signal.
 */
export class HandlerTimedOut extends Error {
  override name = "HandlerTimedOut";
}

export interface RunJobOptions {
  /** The job's fields (default: job 1 of the kind, on `default`, attempt 1 of 5, no owner). */
  job?: Partial<Omit<Job, "kind">>;
  /** The handlers to look the kind up in (default: handlers/mod.ts's). */
  handlers?: HandlerMap;
  /** Milliseconds before the job's signal aborts and the run fails (default 10 s). */
  timeoutMs?: number;
  /** The database's max_result_bytes (default 65536). */
  maxResultBytes?: number;
}

/** What one run of a handler did. */
export interface HandlerRun {
  /** The job the handler was given. */
  job: Job;
  /** Its result as the queue stores it (JSON; null: none). */
  result: Json;
  /** Each progress report, as stored, in order. */
  progress: Json[];
}

/** Runs the handler of `kind` on `payload` (see the top of this file). */
export async function runJob(
  kind: string,
  payload: unknown = {},
  options: RunJobOptions = {},
): Promise<HandlerRun> {
  const handlers = options.handlers ?? projectHandlers;
  if (!Object.hasOwn(handlers, kind)) {
    const known = Object.keys(handlers).join(", ") || "none";
    throw new Error(`no handler for "${kind}": registered are ${known} (handlers/mod.ts)`);
  }
  const job = { ...defaultJob(kind), ...options.job, kind };
  const progress: Json[] = [];
  // Through JSON, as the queue stores it: a value JSON cannot hold fails here.
  const asStored = withDependencies(JSON.parse(JSON.stringify(payload ?? {})), job.dependencies);
  const claimed: ClaimedJob = {
    id: job.id,
    queue: job.queue,
    kind,
    payload: asStored,
    attempts: job.attempt,
    max_attempts: job.maxAttempts,
    lock_token: crypto.randomUUID(),
    locked_at: new Date().toISOString(),
    locked_until: new Date().toISOString(),
    concurrency_key: job.concurrencyKey,
    owner: job.owner,
  };
  const reports = {
    progress: (_attempt: unknown, value: Json) => {
      progress.push(JSON.parse(JSON.stringify(value)));
      return Promise.resolve(true);
    },
  } as Pick<WorkerQueue, "progress"> as WorkerQueue;
  const timeoutMs = options.timeoutMs ?? DEFAULT_TEST_TIMEOUT_MS;
  const timeout = new AbortController();
  const timer = setTimeout(
    () => timeout.abort(new DOMException(`timed out after ${timeoutMs} ms`, "TimeoutError")),
    timeoutMs,
  );
  const outcome = await runInSlot(claimed, timeout.signal, {
    handlers,
    queue: reports,
    clock: systemClock,
    jobLog: () => {},
    meter: unmetered,
    maxResultBytes: () => Promise.resolve(options.maxResultBytes ?? MAX_RESULT_BYTES),
    callSignal: () => new AbortController().signal,
  }).finally(() => clearTimeout(timer));
  if (outcome.ok) return { job, result: outcome.result, progress };
  if (outcome.cut) {
    throw new HandlerTimedOut(
      `the handler of "${kind}" was still running after ${timeoutMs} ms (runJob's timeoutMs): ` +
        "in the function, the drain's deadline would cut it off and the job run again; " +
        "pass the job's signal to what it waits on",
    );
  }
  throw outcome.error;
}

/** The payload as the queue hands it to a job with these dependencies (`_dependencies`). */
function withDependencies(payload: unknown, dependencies: Dependencies): unknown {
  if (dependencies.size === 0) return payload;
  const entries = [...dependencies.byId.values()].map(({ id, ...rest }) => [String(id), rest]);
  return { ...(payload as Record<string, unknown>), _dependencies: Object.fromEntries(entries) };
}

function defaultJob(kind: string): Job {
  return {
    id: 1,
    kind,
    queue: "default",
    attempt: 1,
    maxAttempts: 5,
    concurrencyKey: null,
    owner: null,
    dependencies: NO_DEPENDENCIES,
  };
}

/** No CPU accounting in a test: the handler runs as called. */
const unmetered: CpuMeter = {
  busyMs: () => 0,
  hold: (run) => run(),
  watch: () => {},
  charge: () => {},
  onBusy: () => () => {},
};

/**
 * A handler's context, for tests of one handler: job 42 of `kind` on its first attempt
 * (`job` changes any of that), a signal that never aborts, and progress reports kept in
 * `reported`.
 */
export function jobContext(
  kind: string,
  job: Partial<Job> = {},
): JobContext & { reported: Json[] } {
  const reported: Json[] = [];
  return {
    job: {
      id: 42,
      kind,
      queue: "default",
      attempt: 1,
      maxAttempts: 5,
      concurrencyKey: null,
      owner: null,
      dependencies: NO_DEPENDENCIES,
      ...job,
    },
    signal: new AbortController().signal,
    reportProgress: (progress) => {
      reported.push(progress);
      return Promise.resolve(true);
    },
    reported,
  };
}
