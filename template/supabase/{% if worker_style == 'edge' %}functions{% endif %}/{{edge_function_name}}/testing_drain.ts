// Test helpers (exported by testing.ts) for tests against a database (the db_tests/ folder,
// `deno task test:db`): the stack a test reaches, and drainQueue(), which runs a queue's jobs
// through the project's handlers in-process, with the worker's own drain (worker.ts) and the
// real queue client (queue.ts) through the Data API, and says what each job ended as.
//
//   const queue = testQueueName(); // a queue of the test's own: no other job runs
//   await testStack().queue.enqueue("send_email", { to: "ada@example.com", ... }, { queue });
//   const [email] = await drainQueue(queue);
//   assert.equal(email.outcome, "done");
//
// The stack is read from the names `supabase status -o env` prints (API_URL, SERVICE_ROLE_KEY;
// SUPABASE_URL and SUPABASE_SERVICE_ROLE_KEY first, when set). A drain still going after its
// timeout fails the test with DrainTimedOut, naming each job and what it ended as.
import { dataApi, rowsOf } from "./data_api.ts";
import { handlers as projectHandlers } from "./handlers/mod.ts";
import type { HandlerMap } from "./job.ts";
import {
  type Json,
  type Queue,
  type QueueConnection,
  supabaseQueue,
  type WorkerQueue,
} from "./queue.ts";
import { DEFAULT_SCHEMA, type Env } from "./settings.ts";
import { startDrain } from "./worker.ts";

/** The tests need a stack (`supabase start`) and its values in the environment. */
export class StackMissing extends Error {
  override name = "StackMissing";
}

/** How to give the tests the stack's values, for the errors that ask for them. */
export const STACK_HINT = 'run `supabase start`, then `set -a; eval "$(supabase status -o ' +
  'env)"; set +a` before `deno task test:db`';

/** Where the tests' stack is: its Data API, reached with the real queue client. */
export interface TestStack {
  connection: QueueConnection;
  /** The queue client (queue.ts), with the stack's service key. */
  queue: Queue;
}

/** The stack named by the environment (see the top of this file); StackMissing if none. */
export function testStack(env: Env = (name) => Deno.env.get(name)): TestStack {
  const first = (...names: string[]) => names.map(env).find((value) => value);
  const supabaseUrl = first("SUPABASE_URL", "API_URL");
  const key = first("SUPABASE_SERVICE_ROLE_KEY", "SERVICE_ROLE_KEY");
  if (!supabaseUrl || !key) {
    throw new StackMissing(
      `these tests need a Supabase stack: API_URL and SERVICE_ROLE_KEY are not set: ${STACK_HINT}`,
    );
  }
  const schema = env("PGQUEUE_SCHEMA") || DEFAULT_SCHEMA;
  const connection = { supabaseUrl, serviceKeys: [key], schema };
  return { connection, queue: supabaseQueue(connection) };
}

/** A fresh queue name (`test-` and 12 hex digits), so a test sees only its own jobs. */
export function testQueueName(): string {
  return `test-${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
}

/**
 * What a drained job ended as (`failed`: dead-lettered; `retried`: queued for a retry;
 * `snoozed`: its handler threw a Snooze, and it is queued for later, its attempt not counted;
 * `queued`: not run, waiting in the queue: not due yet, or of a kind no handler runs).
 */
export type DrainOutcome =
  | "done"
  | "queued"
  | "retried"
  | "snoozed"
  | "failed"
  | "released"
  | "cancelled"
  | "running";

export interface DrainedJob {
  id: number;
  kind: string;
  outcome: DrainOutcome;
  /** Attempts counted so far (a released job's last one is not). */
  attempts: number;
  /** What the handler returned, once done (null: nothing). */
  result: Json;
  /** The last attempt's error (the job's last_error). */
  error: string | null;
  /** When a retried, snoozed or released job is due again; null once it finished. */
  runAfter: Date | null;
}

export interface DrainQueueOptions {
  /** The handlers to run (default: handlers/mod.ts's); only their kinds are claimed. */
  handlers?: HandlerMap;
  /** The Data API to drain through (default: testStack()'s). */
  connection?: QueueConnection;
  /** Milliseconds before the drain stops and the test fails with DrainTimedOut (30 s). */
  timeoutMs?: number;
  /** The most jobs running at once (default 5). */
  batchSize?: number;
}

/** The drain did not end within its timeout: a handler never finished, or jobs kept coming. */
export class DrainTimedOut extends Error {
  override name = "DrainTimedOut";
  constructor(message: string, readonly jobs: DrainedJob[]) {
    super(message);
  }
}

/**
 * Runs the due jobs of `queue` (and those their handlers enqueue there) through the handlers,
 * until none is due; what each job it claimed ended as, and each job it left waiting in the
 * queue (`queued`: not due yet, or of a kind no handler runs), by id. A retried job waits for
 * its backoff, so it is not run again: queueClock().advance() makes it due.
 */
export async function drainQueue(
  queue: string,
  options: DrainQueueOptions = {},
): Promise<DrainedJob[]> {
  const connection = options.connection ?? testStack().connection;
  const client = supabaseQueue(connection);
  const claimed = new Map<number, string>();
  const released = new Set<number>();
  const snoozed = new Set<number>();
  const timeoutMs = options.timeoutMs ?? 30_000;
  const summary = await startDrain([queue], {
    queue: recording(client, claimed, released, snoozed),
    handlers: options.handlers ?? projectHandlers,
    workerId: `drainQueue:${crypto.randomUUID().slice(0, 8)}`,
    batchSize: options.batchSize ?? 5,
    timeBudgetMs: timeoutMs,
    // no wall-clock limit of a platform here: the timeout is the deadline
    wallClockLimitMs: 2 * timeoutMs + 10_000,
    lingerPollMs: 100,
    log: () => {},
  }).done;
  if (summary.stoppedBy === "error") {
    throw new Error(`drainQueue("${queue}") stopped: ${summary.error}`);
  }
  const ran = new Set(claimed.keys());
  for (const job of await waiting(connection, queue)) {
    if (!ran.has(job.id)) claimed.set(job.id, job.kind);
  }
  const ended = [];
  for (const id of [...claimed.keys()].sort((a, b) => a - b)) {
    const handedBack = !ran.has(id)
      ? "queued"
      : released.has(id)
      ? "released"
      : snoozed.has(id)
      ? "snoozed"
      : "retried";
    ended.push(await endedAs(client, id, claimed.get(id)!, handedBack));
  }
  if (released.size > 0 || summary.stoppedBy !== "empty") {
    throw new DrainTimedOut(timedOut(queue, timeoutMs, ended), ended);
  }
  return ended;
}

/** The jobs waiting in `queue` (at most 1,000: a test's queue holds a few). */
function waiting(connection: QueueConnection, queue: string) {
  return dataApi(connection).call(
    "list_jobs",
    { status: "queued", queue, page_size: 1000 },
    rowsOf<{ id: number; kind: string }>("queued jobs", { id: "number", kind: "string" }),
  );
}

/** `queue`, recording the jobs each claim took and those handed back or snoozed. */
function recording(
  queue: WorkerQueue,
  claimed: Map<number, string>,
  released: Set<number>,
  snoozed: Set<number>,
): WorkerQueue {
  return {
    ...queue,
    completeAndClaim: async (options) => {
      const jobs = await queue.completeAndClaim(options);
      for (const job of jobs) claimed.set(job.id, job.kind);
      return jobs;
    },
    release: async (attempt, signal) => {
      const handedBack = await queue.release(attempt, signal);
      if (handedBack) released.add(attempt.id);
      return handedBack;
    },
    snooze: async (attempt, seconds, maxSnoozes, signal) => {
      const outcome = await queue.snooze(attempt, seconds, maxSnoozes, signal);
      if (outcome === "queued") snoozed.add(attempt.id);
      return outcome;
    },
  };
}

async function endedAs(
  queue: Queue,
  id: number,
  kind: string,
  queued: "queued" | "released" | "snoozed" | "retried",
): Promise<DrainedJob> {
  const job = await queue.job(id);
  if (job === null) throw new Error(`job ${id} (${kind}) is gone before drainQueue read it`);
  const outcomes: Record<string, DrainOutcome> = {
    done: "done",
    queued,
    failed: "failed",
    cancelled: "cancelled",
    running: "running",
  };
  return {
    id,
    kind,
    outcome: outcomes[job.status],
    attempts: job.attempts,
    result: job.result,
    error: job.last_error,
    runAfter: job.status === "queued" && job.run_after ? new Date(job.run_after) : null,
  };
}

/** One line per job: its id, kind and outcome, and its result or error. */
export function describeDrained(jobs: readonly DrainedJob[]): string {
  const line = (job: DrainedJob) => {
    const detail = job.outcome === "done"
      ? `result ${JSON.stringify(job.result)}`
      : job.error?.split("\n")[0] ?? "no error";
    return `  #${job.id} ${job.kind}: ${job.outcome} (${detail})`;
  };
  return jobs.map(line).join("\n") || "  none";
}

function timedOut(queue: string, timeoutMs: number, jobs: DrainedJob[]): string {
  const stuck = jobs.filter((job) => job.outcome === "released").map((job) => `#${job.id}`);
  return `the drain of queue "${queue}" did not end within ${timeoutMs} ms ` +
    "(drainQueue's timeoutMs)" +
    (stuck.length > 0
      ? `: ${stuck.join(", ")} still running then, handed back to the queue (a handler that ` +
        "never finishes: pass the job's signal to what it waits on)"
      : "") +
    `; its jobs ended as:\n${describeDrained(jobs)}`;
}
