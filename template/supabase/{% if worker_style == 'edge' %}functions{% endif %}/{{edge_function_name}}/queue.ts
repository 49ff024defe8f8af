// Machinery: the queue's client. The worker's calls (WorkerQueue) are here, each one SQL
// function called through data_api.ts; the rest of the SQL contract, for app code, is in
// admin.ts. supabaseQueue() gives both: another Edge Function or a script may use it, e.g.
// `supabaseQueue(loadSettings()).enqueue("send_email", {...})`. Every state change of a running
// job presents the lock token its claim handed out, so a job whose lease was given to another
// worker is never overwritten by this one.
import { type AdminQueue, adminQueue } from "./admin.ts";
import {
  boolean,
  type DataApi,
  dataApi,
  isRecord,
  type Json,
  nothing,
  type QueueConnection,
  rowsOf,
  shape,
} from "./data_api.ts";

// The client's whole surface is importable from here, whichever module defines it.
export type * from "./admin.ts";
export { type Json, type QueueConnection, QueueError, READ_LIMIT } from "./data_api.ts";

/** A claimed job: the row complete_and_claim() returns, and the queue it was claimed from. */
export interface ClaimedJob {
  id: number;
  queue: string;
  kind: string;
  payload: unknown;
  attempts: number;
  max_attempts: number;
  lock_token: string;
  /** When the claim took the job and until when it holds it (ISO timestamps). */
  locked_at: string;
  locked_until: string;
  /** Jobs sharing a key run at most the key's limit at once (null: no key). */
  concurrency_key: string | null;
  /** Who submitted it from the app (owners.ts sets it; the claim does not return it). */
  owner?: string | null;
}

/** A running attempt: the job and the lock token its claim handed out. */
export type Attempt = Pick<ClaimedJob, "id" | "lock_token">;

/** A job that ran to the end, and what its handler returned (null: nothing). */
export interface DoneJob {
  job: ClaimedJob;
  result: Json;
}

export interface CompleteAndClaimOptions {
  worker: string;
  /**
   * Jobs that ran to the end: each is marked done, with its result, unless its lease went to
   * another worker.
   */
  done: readonly DoneJob[];
  queue: string;
  kinds: string[];
  /** How many jobs to claim; 0 only completes `done`. */
  maxJobs: number;
  /** Omitted: the lease configured in the database. */
  leaseSeconds?: number;
  /** Gives up on the call when it aborts (e.g. AbortSignal.timeout). */
  signal?: AbortSignal;
}

/** The job's status after fail(): queued again, dead-lettered, or null when stale. */
export type FailOutcome = "queued" | "failed" | null;

/**
 * The calls the worker makes. Each takes an optional `signal` that gives up on the call when
 * it aborts (the worker passes a timeout); the call then fails with a QueueError.
 */
export interface WorkerQueue {
  /**
   * Completes the jobs `done` (storing their results) and claims the next batch, in one call
   * and one transaction. A job whose lock token is stale (its lease was lost) is left to its
   * new owner. A result over `max_result_bytes` is refused (QueueError, code 54000) and then
   * nothing changes.
   */
  completeAndClaim(options: CompleteAndClaimOptions): Promise<ClaimedJob[]>;
  /** Completes one job, storing `result` (null: none); false when its lease was lost. */
  complete(attempt: Attempt, result?: Json, signal?: AbortSignal): Promise<boolean>;
  /**
   * Fails the attempt: the job goes back to the queue after `retryInSeconds` (undefined: the
   * database's backoff()), or to the dead letters when not `retryable` or out of attempts.
   * `errorType` (the error's name) goes with the error into the job's list of errors.
   */
  fail(
    job: ClaimedJob,
    error: string,
    retryable: boolean,
    signal?: AbortSignal,
    retryInSeconds?: number,
    errorType?: string,
  ): Promise<FailOutcome>;
  /**
   * Fails the job for good with an error its owner reads in `my_jobs` (a UserFacingError):
   * the queue tells such an error by this call, never by its text. "failed", or null when
   * the lease was lost.
   */
  failUserFacing(job: ClaimedJob, message: string, signal?: AbortSignal): Promise<FailOutcome>;
  /**
   * Hands a running job back to the queue, due now, its attempt not counted (the worker is
   * stopping); false when its lease was lost.
   */
  release(attempt: Attempt, signal?: AbortSignal): Promise<boolean>;
  /**
   * Hands a running job back to run after `seconds`, its attempt not counted (a Snooze):
   * "queued"; "failed" when it had snoozed `maxSnoozes` times already (a dead letter now);
   * null when its lease was lost.
   */
  snooze(
    attempt: Attempt,
    seconds: number,
    maxSnoozes: number,
    signal?: AbortSignal,
  ): Promise<FailOutcome>;
  /**
   * Renews the leases of the running `attempts` to `leaseSeconds` from now (never shortening
   * one); returns the ids of those still running under their lock tokens (the others were
   * cancelled, or rescued after their lease ran out: their worker stops them).
   */
  heartbeatMany(
    attempts: readonly Attempt[],
    leaseSeconds: number,
    signal?: AbortSignal,
  ): Promise<number[]>;
  /** Stores how far a running job got (JSON, up to 64 KiB); false when its lease was lost. */
  progress(attempt: Attempt, progress: Json, signal?: AbortSignal): Promise<boolean>;
  /** Tells the database that `worker` claims `kinds` from `queue` (the `unclaimed` view). */
  checkin(worker: string, queue: string, kinds: string[], signal?: AbortSignal): Promise<void>;
  /** The largest result a job may store, in bytes (`max_result_bytes` in the config). */
  maxResultBytes(signal?: AbortSignal): Promise<number>;
  /** The kinds open to the app's signed-in users (the `client_kinds` table). */
  clientKinds(signal?: AbortSignal): Promise<string[]>;
  /** The owner of each of these jobs that a signed-in user submitted (`job_owners()`). */
  jobOwners(ids: readonly number[], signal?: AbortSignal): Promise<Map<number, string>>;
  /**
   * What the jobs job `id` depends on ended with (`dependency_results()`: id, kind, status,
   * result, error), for a job whose payload had their results left out (too large).
   */
  dependencyResults(id: number, signal?: AbortSignal): Promise<unknown[]>;
}

/** The whole queue: the worker's calls, and the rest of the SQL contract for app code. */
export type Queue = WorkerQueue & AdminQueue;

/** The SQLSTATE of a result or progress over its size limit. */
export const TOO_BIG = "54000";

/** The most `max_result_bytes` may be, and what the worker assumes when it cannot read it. */
export const MAX_RESULT_BYTES = 65536;

const failOutcome = shape<FailOutcome>(
  '"queued", "failed" or null',
  (value) => value === null || value === "queued" || value === "failed",
);
const claimedRows = rowsOf<Omit<ClaimedJob, "queue">>("claimed jobs", {
  id: "number",
  kind: "string",
  attempts: "number",
  max_attempts: "number",
  lock_token: "string",
  locked_at: "string",
  locked_until: "string",
  concurrency_key: ["string", "null"],
});
const jobIds = shape<number[]>(
  "a list of job ids",
  (value) => Array.isArray(value) && value.every((id) => typeof id === "number"),
);
const kindRows = rowsOf<{ kind: string }>("client kinds", { kind: "string" });
const ownerRows = rowsOf<{ id: number; owner: string }>("job owners", {
  id: "number",
  owner: "string",
});
const deps = rowsOf<Record<string, unknown>>("dependency results", {
  id: "number",
  kind: "string",
  status: "string",
});
const configRow = shape<{ max_result_bytes: number }[]>(
  "the config row, with its max_result_bytes",
  (value) =>
    Array.isArray(value) && value.length === 1 && isRecord(value[0]) &&
    typeof value[0].max_result_bytes === "number",
);

/** The queue in `connection`'s database, through its Data API. */
export function supabaseQueue(connection: QueueConnection): Queue {
  const api = dataApi(connection);
  return { ...workerQueue(api), ...adminQueue(api) };
}

/** The worker's calls, each one SQL function (and the config's row) through `api`. */
export function workerQueue(api: DataApi): WorkerQueue {
  return {
    completeAndClaim: async ({ worker, done, queue, kinds, maxJobs, leaseSeconds, signal }) => {
      const rows = await api.call(
        "complete_and_claim",
        {
          worker,
          done_ids: done.map(({ job }) => job.id),
          done_tokens: done.map(({ job }) => job.lock_token),
          max_jobs: maxJobs,
          kinds,
          queue,
          ...(leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds }),
          ...doneResults(done),
        },
        claimedRows,
        signal,
      );
      return rows.map((row) => ({ ...row, queue }));
    },
    complete: (attempt, result = null, signal) =>
      api.call("complete", { ...lease(attempt), result }, boolean, signal),
    fail: (job, error, retryable, signal, ...chosen) =>
      api.call("fail", failArgs(job, error, retryable, ...chosen), failOutcome, signal),
    failUserFacing: (job, message, signal) =>
      api.call("fail_user_facing", { ...lease(job), message }, failOutcome, signal),
    release: (attempt, signal) => api.call("release", lease(attempt), boolean, signal),
    snooze: (attempt, seconds, maxSnoozes, signal) =>
      api.call("snooze", snoozeArgs(attempt, seconds, maxSnoozes), failOutcome, signal),
    heartbeatMany: (attempts, leaseSeconds, signal) =>
      api.call(
        "heartbeat_many",
        {
          job_ids: attempts.map(({ id }) => id),
          lock_tokens: attempts.map(({ lock_token }) => lock_token),
          lease_seconds: leaseSeconds,
        },
        jobIds,
        signal,
      ),
    progress: (attempt, progress, signal) =>
      api.call("progress", { ...lease(attempt), progress }, boolean, signal),
    checkin: (worker, queue, kinds, signal) =>
      api.call("checkin", { worker, queue, kinds }, nothing, signal),
    maxResultBytes: async (signal) => {
      const [row] = await api.read("config", configRow, { columns: "max_result_bytes", signal });
      return row.max_result_bytes;
    },
    clientKinds: async (signal) =>
      (await api.read("client_kinds", kindRows, { columns: "kind", signal })).map((r) => r.kind),
    jobOwners: async (ids, signal) => {
      const rows = await api.call("job_owners", { job_ids: ids }, ownerRows, signal);
      return new Map(rows.map(({ id, owner }) => [id, owner]));
    },
    dependencyResults: (job_id, signal) => api.call("dependency_results", { job_id }, deps, signal),
  };
}

/**
 * complete_and_claim()'s `done_results`, only when a job has one (without results, completions
 * are kept by batch). A JSON array in an array argument would be read as a dimension of it
 * (`[["a", "b"]]`: two results), so the results go as a Postgres array literal, each one's
 * JSON text an element: `{"[\"a\", \"b\"]",NULL}`.
 */
function doneResults(done: readonly DoneJob[]): { done_results?: string } {
  if (!done.some(({ result }) => result !== null)) return {};
  const quoted = done.map(({ result }) =>
    result === null ? "NULL" : `"${JSON.stringify(result).replace(/[\\"]/g, "\\$&")}"`
  );
  return { done_results: `{${quoted.join(",")}}` };
}

/** fail()'s arguments: `retry_in` only when the worker chose the delay, `error_type` when known. */
function failArgs(
  job: Attempt,
  error: string,
  retryable: boolean,
  retryInSeconds?: number,
  errorType?: string,
) {
  return {
    ...lease(job),
    error,
    retryable,
    ...(retryInSeconds === undefined ? {} : { retry_in: interval(retryInSeconds) }),
    ...(errorType === undefined ? {} : { error_type: errorType }),
  };
}

/** snooze()'s arguments. */
function snoozeArgs(attempt: Attempt, seconds: number, maxSnoozes: number) {
  return { ...lease(attempt), seconds, max_snoozes: maxSnoozes };
}

/** Seconds as a Postgres interval, to the millisecond (never in exponent notation). */
function interval(seconds: number): string {
  return `${(Math.round(seconds * 1000) / 1000).toFixed(3)} seconds`;
}

/** The arguments that say which attempt a call is about: the job and its claim's lock token. */
function lease(attempt: Attempt) {
  return { job_id: attempt.id, lock_token: attempt.lock_token };
}
