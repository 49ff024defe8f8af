// Machinery: the queue's SQL functions and views, called through the Data API (PostgREST)
// with supabase-js. The worker uses the calls in WorkerQueue; app code (another Edge Function,
// a script) may use all of Queue, e.g. `supabaseQueue(loadSettings()).enqueue("send_email",
// {...})`. Every state change of a running job presents the lock token its claim handed out,
// so a job whose lease was given to another worker is never overwritten by this one.
import { createClient } from "@supabase/supabase-js";
import type { Settings } from "./settings.ts";

/** A JSON value: what payloads, results and progress are. */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

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

/** What enqueue() does when a job with the same idempotency key is still waiting. */
export type OnConflict = "keep" | "replace" | "debounce";

export interface EnqueueOptions {
  /** Not before this time (default: now). */
  runAfter?: Date | string;
  /** At most one job per key: a repeat returns the existing job's id (see `onConflict`). */
  idempotencyKey?: string;
  /** Default `default`. */
  queue?: string;
  /** Higher runs first (default 0). */
  priority?: number;
  /** Default: `max_attempts` in the queue's config. */
  maxAttempts?: number;
  /** Jobs sharing a key run at most the key's limit at once (setConcurrencyLimit()). */
  concurrencyKey?: string;
  /**
   * With a taken idempotency key, while its job waits: `keep` it as it is (the default),
   * `replace` its payload, run_after, priority and max_attempts, or `debounce` (its payload,
   * and the later of the two run_after). A running or finished job is never changed.
   */
  onConflict?: OnConflict;
  /**
   * A W3C traceparent (`00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>`): the job's
   * handler span joins that trace. The database refuses a malformed one (code 22023).
   */
  traceparent?: string;
}

/** One job of enqueueMany(); a taken idempotency key keeps the existing job. */
export interface NewJob extends Omit<EnqueueOptions, "onConflict"> {
  kind: string;
  payload?: Json;
}

/** One job by id, live or finished: the row job() returns. */
export interface JobRecord {
  id: number;
  queue: string;
  kind: string;
  status: "queued" | "running" | "done" | "failed" | "cancelled";
  priority: number | null;
  attempts: number;
  max_attempts: number | null;
  /** Null once the job is done. */
  payload: Json;
  /** What the running attempt last reported (null once it finished). */
  progress: Json;
  /** What the handler returned, once done (null: nothing). */
  result: Json;
  last_error: string | null;
  concurrency_key: string | null;
  idempotency_key: string | null;
  run_after: string | null;
  locked_until: string | null;
  created_at: string;
  finished_at: string | null;
}

/** A row of the `stats` view: jobs per queue, kind and status. */
export interface StatsRow {
  queue: string;
  kind: string;
  status: string;
  jobs: number;
  runnable: number;
  /** A Postgres interval, e.g. "00:00:03.5"; null when none is runnable. */
  oldest_runnable_age: string | null;
  paused: boolean;
}

/** A row of the `queue_states` view: each queue with jobs or a state. */
export interface QueueState {
  queue: string;
  paused: boolean;
  paused_at: string | null;
  rate_per_second: number | null;
  rate_burst: number | null;
  queued: number;
  running: number;
}

/**
 * A row of metrics(): one Prometheus sample. Names ending in `_total` are counters, the others
 * gauges; label values are strings.
 */
export interface MetricSample {
  metric: string;
  labels: Record<string, string>;
  value: number;
}

/** A row of throughput(): the jobs of one queue that finished in one minute. */
export interface ThroughputPoint {
  /** The minute (ISO timestamp). */
  minute: string;
  queue: string;
  done: number;
  /** Dead-lettered. */
  failed: number;
  cancelled: number;
}

/** A row of the `schedules` view: a recurring job and its pg_cron state. */
export interface Schedule {
  name: string;
  cron: string;
  kind: string;
  payload: Json;
  queue: string;
  active: boolean | null;
  last_run_at: string | null;
  last_run_status: string | null;
  created_at: string;
}

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
  fail(
    job: ClaimedJob,
    error: string,
    retryable: boolean,
    signal?: AbortSignal,
  ): Promise<FailOutcome>;
  /**
   * Hands a running job back to the queue, due now, its attempt not counted (the worker is
   * stopping); false when its lease was lost.
   */
  release(attempt: Attempt, signal?: AbortSignal): Promise<boolean>;
  /** Stores how far a running job got (JSON, up to 64 KiB); false when its lease was lost. */
  progress(attempt: Attempt, progress: Json, signal?: AbortSignal): Promise<boolean>;
  /** Tells the database that `worker` claims `kinds` from `queue` (the `unclaimed` view). */
  checkin(worker: string, queue: string, kinds: string[], signal?: AbortSignal): Promise<void>;
  /** The largest result a job may store, in bytes (`max_result_bytes` in the config). */
  maxResultBytes(signal?: AbortSignal): Promise<number>;
}

/** The whole queue: the worker's calls, and the rest of the SQL contract for app code. */
export interface Queue extends WorkerQueue {
  /** Adds a job; its id (the existing job's, when the idempotency key is taken). */
  enqueue(kind: string, payload?: Json, options?: EnqueueOptions): Promise<number>;
  /** Adds jobs in one call; their ids, in order. */
  enqueueMany(jobs: readonly NewJob[]): Promise<number[]>;
  /**
   * At most `maxRunning` (1 to 100,000) jobs of `concurrencyKey` run at once, across all
   * workers; null removes the key's own limit. Returns the limit now in force (null: none).
   */
  setConcurrencyLimit(concurrencyKey: string, maxRunning: number | null): Promise<number | null>;
  /** Stops claiming `queue`'s jobs; running ones finish. True if it was running. */
  pause(queue: string): Promise<boolean>;
  /** Claims `queue`'s jobs again and wakes the workers. True if it was paused. */
  resume(queue: string): Promise<boolean>;
  /**
   * Claims of `queue` start at most `perSecond` jobs a second on average and `burst` at once
   * (default: perSecond rounded up); null perSecond removes the limit.
   */
  setRateLimit(queue: string, perSecond: number | null, burst?: number): Promise<void>;
  /** Enqueues a `kind` job on `cron` (pg_cron), one per time slot; pg_cron's job id. */
  schedule(
    name: string,
    cron: string,
    kind: string,
    payload?: Json,
    queue?: string,
  ): Promise<number>;
  /** Stops a recurring job (its queued jobs stay); false when there was none. */
  unschedule(name: string): Promise<boolean>;
  /** One job by id, wherever it is; null for an unknown id (or one pruned). */
  job(id: number): Promise<JobRecord | null>;
  schedules(): Promise<Schedule[]>;
  queueStates(): Promise<QueueState[]>;
  stats(): Promise<StatsRow[]>;
  /** The queue's gauges and counters, ordered by metric then labels. */
  metrics(): Promise<MetricSample[]>;
  /**
   * Jobs finished per minute and queue over the last `minutes` (1 to 1440, default 30),
   * oldest first, a row for every minute of every queue; refused (22023) outside that range.
   */
  throughput(minutes?: number): Promise<ThroughputPoint[]>;
  /** The traceparent each of these live jobs was enqueued with, for those that have one. */
  traceContexts(ids: readonly number[]): Promise<Map<number, string>>;
  /** Changes the settings in `changes` (none: only reads); the whole configuration. */
  configure(changes?: Record<string, Json>): Promise<Record<string, Json>>;
}

/** What a call through the Data API failed with. */
export class QueueError extends Error {
  override name = "QueueError";
  constructor(
    message: string,
    /** The SQL function or view called, e.g. "enqueue()". */
    readonly call: string,
    /** The SQLSTATE, or PostgREST's PGRST code; "" when the request never got an answer. */
    readonly code: string,
    /** What the database (or the network) said, without the call, URL or hint. */
    readonly reason: string,
    /** The database's advice, if it gave any. */
    readonly hint = "",
  ) {
    super(message);
  }
}

/** The SQLSTATE of a result or progress over its size limit. */
export const TOO_BIG = "54000";

/** The most `max_result_bytes` may be, and what the worker assumes when it cannot read it. */
export const MAX_RESULT_BYTES = 65536;

const MAX_CONCURRENCY_KEY_LENGTH = 200;

/** The most rows the Data API returns at once (Supabase's default "max rows"). */
export const READ_LIMIT = 1000;

/** What a call must return, checked before anything uses it. */
interface Shape<T> {
  expected: string;
  is(value: unknown): value is T;
}

function shape<T>(expected: string, is: (value: unknown) => boolean): Shape<T> {
  return { expected, is: is as (value: unknown) => value is T };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The kinds of JSON value a field may hold. */
const KINDS = {
  number: (value: unknown) => typeof value === "number",
  string: (value: unknown) => typeof value === "string",
  null: (value: unknown) => value === null,
  object: isRecord,
};
type Kind = keyof typeof KINDS;

/** A list of objects, each with `fields` of their kinds (other fields unchecked). */
function rowsOf<T>(what: string, fields: Record<string, Kind | Kind[]>): Shape<T[]> {
  const fits = (value: unknown, kinds: Kind | Kind[]) =>
    [kinds].flat().some((kind) => KINDS[kind](value));
  return shape(
    `a list of ${what}`,
    (value) =>
      Array.isArray(value) &&
      value.every((row) =>
        isRecord(row) && Object.entries(fields).every(([name, kinds]) => fits(row[name], kinds))
      ),
  );
}

const boolean = shape<boolean>("true or false", (value) => typeof value === "boolean");
const nothing = shape<void>("nothing", () => true);
const jobId = shape<number>("an id", Number.isInteger);
const jobIds = shape<number[]>(
  "a list of ids",
  (value) => Array.isArray(value) && value.every(Number.isInteger),
);
const countOrNull = shape<number | null>(
  "a number or null",
  (value) => value === null || typeof value === "number",
);
const failOutcome = shape<FailOutcome>(
  '"queued", "failed" or null',
  (value) => value === null || value === "queued" || value === "failed",
);
const configuration = shape<Record<string, Json>>("the configuration (an object)", isRecord);
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
const jobRows = rowsOf<JobRecord>("jobs", { id: "number", status: "string" });
const metricRows = rowsOf<MetricSample>("metric samples", {
  metric: "string",
  labels: "object",
  value: ["number", "string"],
});
const throughputRows = rowsOf<ThroughputPoint>("minutes", { minute: "string", queue: "string" });
const traceRows = rowsOf<{ id: number; traceparent: string }>("trace contexts", {
  id: "number",
  traceparent: "string",
});

/** Where the queue lives: the settings' API URL, key (the first) and schema. */
export type QueueConnection = Pick<Settings, "supabaseUrl" | "serviceKeys" | "schema">;

export function supabaseQueue(settings: QueueConnection): Queue {
  const client = createClient(settings.supabaseUrl, settings.serviceKeys[0], {
    auth: {
      persistSession: false,
      autoRefreshToken: false,
      detectSessionInUrl: false,
    },
  });
  const db = client.schema(settings.schema);

  /** `name` is the function, e.g. "enqueue()", or the view read. */
  function failure(name: string, error: { message: string; code?: string; hint?: string }) {
    return new QueueError(
      `${settings.schema}.${name} failed through ${settings.supabaseUrl}: ${error.message}` +
        (error.hint ? ` (hint: ${error.hint})` : ""),
      name,
      error.code ?? "",
      error.message,
      error.hint ?? "",
    );
  }

  /** Calls the SQL function `fn` and checks that what it returned has the expected shape. */
  async function call<T>(
    fn: string,
    args: Record<string, unknown>,
    shape: Shape<T>,
    signal?: AbortSignal,
  ): Promise<T> {
    let answer;
    try {
      const request = db.rpc(fn, args);
      answer = await (signal ? request.abortSignal(signal) : request);
    } catch (error) {
      // e.g. a value JSON cannot carry (a BigInt, a cycle)
      throw failure(`${fn}()`, { message: String(error) });
    }
    if (answer.error) throw failure(`${fn}()`, answer.error);
    return checked(`${fn}()`, answer.data, shape);
  }

  /**
   * Reads a view, refusing to return a partial answer: the Data API returns at most
   * READ_LIMIT rows at once (its "max rows" setting) and says nothing when it cuts a list.
   */
  async function read<T extends object>(
    view: string,
    columns = "*",
    signal?: AbortSignal,
  ): Promise<T[]> {
    const request = db.from(view).select(columns).limit(READ_LIMIT);
    const { data, error } = await (signal ? request.abortSignal(signal) : request);
    if (error) throw failure(view, error);
    const rows = checked(view, data, rowsOf<T>("rows", {}));
    if (rows.length >= READ_LIMIT) {
      throw failure(view, {
        message: `${view} has ${READ_LIMIT} rows or more, the most the Data API returns at ` +
          "once: read it with SQL (or a narrower view) instead",
      });
    }
    return rows;
  }

  function checked<T>(name: string, data: unknown, shape: Shape<T>): T {
    if (shape.is(data)) return data;
    const got = JSON.stringify(data)?.slice(0, 200) ?? String(data);
    throw failure(name, {
      message: `returned ${got}, not ${shape.expected}: are the project's migrations applied ` +
        `to this database, and is ${settings.schema} the queue's schema?`,
    });
  }

  return {
    completeAndClaim: async ({ worker, done, queue, kinds, maxJobs, leaseSeconds, signal }) => {
      const rows = await call(
        "complete_and_claim",
        {
          worker,
          done_ids: done.map(({ job }) => job.id),
          done_tokens: done.map(({ job }) => job.lock_token),
          max_jobs: maxJobs,
          kinds,
          queue,
          ...(leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds }),
          // Only when a job has one: without results, completions are kept by batch.
          ...(done.some(({ result }) => result !== null)
            ? { done_results: done.map(({ result }) => result) }
            : {}),
        },
        claimedRows,
        signal,
      );
      return rows.map((row) => ({ ...row, queue }));
    },
    complete: (attempt, result = null, signal) =>
      call(
        "complete",
        {
          job_id: attempt.id,
          lock_token: attempt.lock_token,
          result,
        },
        boolean,
        signal,
      ),
    fail: (job, error, retryable, signal) =>
      call(
        "fail",
        {
          job_id: job.id,
          lock_token: job.lock_token,
          error,
          retryable,
        },
        failOutcome,
        signal,
      ),
    release: (attempt, signal) =>
      call("release", { job_id: attempt.id, lock_token: attempt.lock_token }, boolean, signal),
    progress: (attempt, progress, signal) =>
      call(
        "progress",
        {
          job_id: attempt.id,
          lock_token: attempt.lock_token,
          progress,
        },
        boolean,
        signal,
      ),
    checkin: (worker, queue, kinds, signal) =>
      call("checkin", { worker, queue, kinds }, nothing, signal),
    maxResultBytes: async (signal) => {
      const [row] = await read<{ max_result_bytes: number }>(
        "config",
        "max_result_bytes",
        signal,
      );
      if (typeof row?.max_result_bytes !== "number") {
        throw failure("config", { message: "no max_result_bytes in the config row" });
      }
      return row.max_result_bytes;
    },

    enqueue: async (kind, payload = {}, options = {}) =>
      await call("enqueue", {
        kind,
        payload,
        ...newJobArgs(options),
        ...(options.onConflict === undefined ? {} : { on_conflict: options.onConflict }),
      }, jobId),
    enqueueMany: async (jobs) =>
      await call("enqueue_many", {
        jobs: jobs.map(({ kind, payload, ...options }) => ({
          kind,
          ...(payload === undefined ? {} : { payload }),
          ...newJobArgs(options),
        })),
      }, jobIds),
    setConcurrencyLimit: async (concurrencyKey, maxRunning) =>
      await call("set_concurrency_limit", {
        concurrency_key: checkedKey(concurrencyKey),
        max_running: maxRunning,
      }, countOrNull),
    pause: (queue) => call("pause", { queue }, boolean),
    resume: (queue) => call("resume", { queue }, boolean),
    setRateLimit: (queue, perSecond, burst) =>
      call("set_rate_limit", {
        queue,
        per_second: perSecond,
        ...(burst === undefined ? {} : { burst }),
      }, nothing),
    schedule: (name, cron, kind, payload = {}, queue = "default") =>
      call("schedule", { name, cron, kind, payload, queue }, jobId),
    unschedule: (name) => call("unschedule", { name }, boolean),
    job: async (id) => (await call("job", { job_id: id }, jobRows))[0] ?? null,
    schedules: () => read<Schedule>("schedules"),
    queueStates: () => read<QueueState>("queue_states"),
    stats: () => read<StatsRow>("stats"),
    metrics: () => call("metrics", {}, metricRows),
    throughput: (minutes = 30) => call("throughput", { minutes }, throughputRows),
    traceContexts: async (ids) => {
      const rows = await call("trace_contexts", { job_ids: ids }, traceRows);
      return new Map(rows.map(({ id, traceparent }) => [id, traceparent]));
    },
    configure: (changes = {}) => call("configure", { changes }, configuration),
  };
}

/** enqueue()'s and enqueue_many()'s arguments for `options`, only those given. */
function newJobArgs(options: Omit<EnqueueOptions, "onConflict">): Record<string, unknown> {
  const args: Record<string, unknown> = {
    run_after: options.runAfter instanceof Date ? options.runAfter.toISOString() : options.runAfter,
    idempotency_key: options.idempotencyKey,
    queue: options.queue,
    priority: options.priority,
    max_attempts: options.maxAttempts,
    concurrency_key: options.concurrencyKey === undefined
      ? undefined
      : checkedKey(options.concurrencyKey),
    traceparent: options.traceparent,
  };
  return Object.fromEntries(Object.entries(args).filter(([, value]) => value !== undefined));
}

/** The database refuses other keys with a bare constraint name; say what is wrong instead. */
function checkedKey(key: string): string {
  // Postgres counts characters (code points), as the spread does.
  if (typeof key !== "string" || key === "" || [...key].length > MAX_CONCURRENCY_KEY_LENGTH) {
    const reason = `a concurrency key is 1 to ${MAX_CONCURRENCY_KEY_LENGTH} characters, got ` +
      JSON.stringify(key);
    throw new QueueError(reason, "concurrency_key", "22023", reason);
  }
  return key;
}
