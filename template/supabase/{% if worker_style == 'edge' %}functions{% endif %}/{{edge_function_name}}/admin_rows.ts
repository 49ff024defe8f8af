// The rows the queue's SQL functions and views answer with, as admin.ts reads them (queue.ts
// exports them with the client).
import type { Json } from "./data_api.ts";

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
  /** Each failed attempt's error, oldest first (the newest 20 are kept). */
  errors: AttemptError[];
  /** How many times its handler snoozed it (Snooze: run again later, no attempt spent). */
  snoozes: number;
}

/** The error one failed attempt of a job ended with: an element of JobRecord.errors. */
export interface AttemptError {
  attempt: number;
  at: string;
  worker: string | null;
  /** The error's name (`TypeError`); LeaseExpired for a lease the sweeper rescued. */
  type: string | null;
  /** The error's text with its stack, at most 8,192 characters. */
  message: string;
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

/** A row of health(): one thing wake-ups and rescues depend on, and what to do if it fails. */
export interface HealthCheck {
  component: string;
  ok: boolean;
  detail: string;
}

/**
 * A row of the `schedules` view: a recurring job, the pg_cron job that runs it, and its next 3
 * runs (instants, and the local times they stand for).
 */
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
  time_zone: string;
  catch_up: boolean;
  last_slot: string | null;
  next_runs: string[] | null;
  next_runs_local: string[] | null;
}
