// Machinery: the queue's SQL contract beyond the worker's calls, for app code (another Edge
// Function, a script): enqueue, flow control, schedules, reading jobs, observability and
// configuration. Each method calls one SQL function (or reads one view) through data_api.ts,
// with its named arguments and the shape its answer must have; the type `AdminQueue` is read
// off these methods, so a new SQL function needs one method here and nothing else.
import {
  boolean,
  type DataApi,
  isRecord,
  type Json,
  nothing,
  QueueError,
  rowsOf,
  shape,
} from "./data_api.ts";
import type {
  HealthCheck,
  JobRecord,
  MetricSample,
  QueueState,
  Schedule,
  StatsRow,
  ThroughputPoint,
} from "./admin_rows.ts";

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
  /**
   * Runs once these jobs are done (ids of jobs enqueued before), their results in its
   * handler's `job.dependencies`; a dependency dead-lettered or cancelled cancels it, unless
   * `onDependencyFailure` is "run". A Workflow (workflow.ts) enqueues many such jobs at once.
   */
  dependsOn?: readonly number[];
  onDependencyFailure?: OnDependencyFailure;
}

/** What a job does when a job it depends on is dead-lettered or cancelled. */
export type OnDependencyFailure = "cancel" | "run";

/** One job of enqueueMany(); a taken idempotency key keeps the existing job. */
export interface NewJob extends Omit<EnqueueOptions, "onConflict"> {
  kind: string;
  payload?: Json;
  /** Runs once these jobs of the same enqueueMany() call are done (their indexes in it). */
  dependsOnIndex?: readonly number[];
}

export type * from "./admin_rows.ts";

const MAX_CONCURRENCY_KEY_LENGTH = 200;

const jobId = shape<number>("an id", Number.isInteger);
const jobIds = shape<number[]>(
  "a list of ids",
  (value) => Array.isArray(value) && value.every(Number.isInteger),
);
const countOrNull = shape<number | null>(
  "a number or null",
  (value) => value === null || typeof value === "number",
);
const configuration = shape<Record<string, Json>>("the configuration (an object)", isRecord);
const jobRows = rowsOf<JobRecord>("jobs", { id: "number", status: "string" });
const metricRows = rowsOf<MetricSample>("metric samples", {
  metric: "string",
  labels: "object",
  value: ["number", "string"],
});
const throughputRows = rowsOf<ThroughputPoint>("minutes", { minute: "string", queue: "string" });
const healthRows = rowsOf<HealthCheck>("health checks", {
  component: "string",
  ok: "boolean",
  detail: "string",
});
const clientKindRows = rowsOf<{ kind: string; per_minute: number }>("client kinds", {
  kind: "string",
  per_minute: "number",
});
const traceRows = rowsOf<{ id: number; traceparent: string }>("trace contexts", {
  id: "number",
  traceparent: "string",
});

/**
 * The calls of app code, each one SQL function or view through `api`. Those that check their
 * arguments first are async, so that a refused argument is a rejected promise, as a refused
 * call is.
 */
export function adminQueue(api: DataApi) {
  return {
    ...jobCalls(api),
    ...flowControlCalls(api),
    ...scheduleCalls(api),
    ...clientKindCalls(api),
    ...observationCalls(api),
  };
}

/** Jobs: adding them, bringing back or cancelling one, reading one. */
function jobCalls(api: DataApi) {
  return {
    /** Adds a job; its id (the existing job's, when the idempotency key is taken). */
    enqueue: async (kind: string, payload: Json = {}, options: EnqueueOptions = {}) =>
      await api.call("enqueue", {
        kind,
        payload,
        ...newJobArgs(options),
        ...(options.onConflict === undefined ? {} : { on_conflict: options.onConflict }),
      }, jobId),
    /** Adds jobs in one call; their ids, in order. */
    enqueueMany: async (jobs: readonly NewJob[]) =>
      await api.call("enqueue_many", {
        jobs: jobs.map(({ kind, payload, ...options }) => ({
          kind,
          ...(payload === undefined ? {} : { payload }),
          ...newJobArgs(options),
        })),
      }, jobIds),
    /**
     * Brings a dead-lettered or cancelled job back to the queue, due at `runAfter` (default:
     * now), its attempts counted from 0; false when there is no such job.
     */
    retry: (id: number, runAfter?: Date | string) =>
      api.call("retry", {
        job_id: id,
        ...(runAfter === undefined ? {} : { run_after: timestamp(runAfter) }),
      }, boolean),
    /**
     * Cancels a queued or running job (a running one's worker learns it when it next reports);
     * false when it is neither.
     */
    cancel: (id: number) => api.call("cancel", { job_id: id }, boolean),
    /** One job by id, wherever it is; null for an unknown id (or one pruned). */
    job: async (id: number): Promise<JobRecord | null> =>
      (await api.call("job", { job_id: id }, jobRows))[0] ?? null,
    /** The traceparent each of these live jobs was enqueued with, for those that have one. */
    traceContexts: async (ids: readonly number[]) => {
      const rows = await api.call("trace_contexts", { job_ids: ids }, traceRows);
      return new Map(rows.map(({ id, traceparent }) => [id, traceparent]));
    },
  };
}

/** Flow control: pauses, limits and the queue's configuration. */
function flowControlCalls(api: DataApi) {
  return {
    /**
     * At most `maxRunning` (1 to 100,000) jobs of `concurrencyKey` run at once, across all
     * workers; null removes the key's own limit. `strict` (with maxRunning 1): the key's jobs
     * run in enqueue order even across retries, a failed job holding the later ones until it
     * succeeds, is dead-lettered or is cancelled. Returns the limit now in force (null: none).
     */
    setConcurrencyLimit: async (
      concurrencyKey: string,
      maxRunning: number | null,
      { strict = false }: { strict?: boolean } = {},
    ) =>
      await api.call("set_concurrency_limit", {
        concurrency_key: checkedKey(concurrencyKey),
        max_running: maxRunning,
        ...(strict ? { strict } : {}),
      }, countOrNull),
    /** Stops claiming `queue`'s jobs; running ones finish. True if it was running. */
    pause: (queue: string) => api.call("pause", { queue }, boolean),
    /** Claims `queue`'s jobs again and wakes the workers. True if it was paused. */
    resume: (queue: string) => api.call("resume", { queue }, boolean),
    /**
     * Claims of `queue` start at most `perSecond` jobs a second on average and `burst` at once
     * (default: perSecond rounded up); null perSecond removes the limit.
     */
    setRateLimit: (queue: string, perSecond: number | null, burst?: number) =>
      api.call("set_rate_limit", {
        queue,
        per_second: perSecond,
        ...(burst === undefined ? {} : { burst }),
      }, nothing),
    /** Changes the settings in `changes` (none: only reads); the whole configuration. */
    configure: (changes: Record<string, Json> = {}) =>
      api.call("configure", { changes }, configuration),
  };
}

/** Recurring jobs. */
function scheduleCalls(api: DataApi) {
  return {
    /**
     * Enqueues a `kind` job on `cron` (five fields, read in `timeZone`, an IANA name: UTC by
     * default), one per time slot; with `catchUp`, a slot missed while nothing ran runs once on
     * return. The id of the pg_cron job that runs it.
     */
    schedule: (
      name: string,
      cron: string,
      kind: string,
      payload: Json = {},
      queue = "default",
      { timeZone, catchUp }: { timeZone?: string; catchUp?: boolean } = {},
    ) =>
      api.call("schedule", {
        name,
        cron,
        kind,
        payload,
        queue,
        ...(timeZone === undefined ? {} : { time_zone: timeZone }),
        ...(catchUp === undefined ? {} : { catch_up: catchUp }),
      }, jobId),
    /** Stops a recurring job (its queued jobs stay); false when there was none. */
    unschedule: (name: string) => api.call("unschedule", { name }, boolean),
  };
}

/** The kinds the app's signed-in users may submit (docs/client-jobs.md). */
function clientKindCalls(api: DataApi) {
  return {
    /**
     * Lets signed-in users submit jobs of `kind` from the app (`client_enqueue()`), at most
     * `perMinute` (1 to 10000) a minute each, with at most `caps.maxPerUser` (1 to 10000) of
     * each user's queued or running at once and `caps.maxTotal` (1 to 1000000) of all
     * users'. A cap not given is 100 and 10,000 for a new kind, and stays as it was for a kind
     * already open; again: changes the rate and caps.
     */
    allowClientKind: (
      kind: string,
      perMinute: number,
      caps: { maxPerUser?: number; maxTotal?: number } = {},
    ) =>
      api.call(
        "allow_client_kind",
        {
          kind,
          per_minute: perMinute,
          ...(caps.maxPerUser === undefined ? {} : { max_per_user: caps.maxPerUser }),
          ...(caps.maxTotal === undefined ? {} : { max_total: caps.maxTotal }),
        },
        nothing,
      ),
    /** Refuses new submissions of `kind` from the app; false when it was not open. */
    disallowClientKind: (kind: string) => api.call("disallow_client_kind", { kind }, boolean),
    /** The kinds open to signed-in users, each with its per-user rate a minute. */
    allowedClientKinds: () =>
      api.read("client_kinds", clientKindRows, { columns: "kind,per_minute" }),
  };
}

/** What the queue holds and does: its views, metrics, throughput and health. */
function observationCalls(api: DataApi) {
  return {
    /** The recurring jobs and their pg_cron state (the `schedules` view). */
    schedules: () => api.read("schedules", rowsOf<Schedule>("schedules", {})),
    /** Each queue with jobs or a state: paused, rate limit, queued and running jobs. */
    queueStates: () => api.read("queue_states", rowsOf<QueueState>("queue states", {})),
    /** Jobs per queue, kind and status (the `stats` view). */
    stats: () => api.read("stats", rowsOf<StatsRow>("stats rows", {})),
    /** The queue's gauges and counters, ordered by metric then labels. */
    metrics: () => api.call("metrics", {}, metricRows),
    /**
     * Jobs finished per minute and queue over the last `minutes` (1 to 1440, default 30),
     * oldest first, a row for every minute of every queue; refused (22023) outside that range.
     */
    throughput: (minutes = 30) => api.call("throughput", { minutes }, throughputRows),
    /** What wake-ups and rescues depend on (pg_net, the worker's URL and key), each ok or not. */
    health: () => api.call("health", {}, healthRows),
  };
}

/** The calls adminQueue() makes: the whole queue less the worker's calls (queue.ts). */
export type AdminQueue = ReturnType<typeof adminQueue>;

/** enqueue()'s and enqueue_many()'s arguments for `options`, only those given. */
/** A job's options as enqueue() and enqueue_many() name them (e.g. `max_attempts`). */
export function newJobArgs(options: Omit<NewJob, "kind" | "payload">): Record<string, Json> {
  const args: Record<string, unknown> = {
    run_after: options.runAfter === undefined ? undefined : timestamp(options.runAfter),
    idempotency_key: options.idempotencyKey,
    queue: options.queue,
    priority: options.priority,
    max_attempts: options.maxAttempts,
    concurrency_key: options.concurrencyKey === undefined
      ? undefined
      : checkedKey(options.concurrencyKey),
    traceparent: options.traceparent,
    depends_on: options.dependsOn,
    depends_on_index: options.dependsOnIndex,
    on_dependency_failure: options.onDependencyFailure,
  };
  return Object.fromEntries(
    Object.entries(args).filter(([, value]) => value !== undefined),
  ) as Record<string, Json>;
}

/** A time as the Data API takes it: an ISO timestamp (a string is passed on as it is). */
function timestamp(time: Date | string): string {
  return time instanceof Date ? time.toISOString() : time;
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
