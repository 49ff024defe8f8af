// Machinery: what a handler is. Handlers in handlers/ are built with defineHandler(), may
// return a result and report progress, may throw PermanentError, RetryAfter or Snooze, and may
// give their kind its own backoff; the worker (worker.ts) does the rest.
import { z } from "zod";
import type { Json } from "./queue.ts";
import type { Dependencies, Kind } from "./dependencies.ts";

export {
  defineKind,
  Dependencies,
  type Dependency,
  type Kind,
  NO_DEPENDENCIES,
} from "./dependencies.ts";

/** The job a handler is running. */
export interface Job {
  id: number;
  kind: string;
  queue: string;
  /** 1 for the first attempt. */
  attempt: number;
  maxAttempts: number;
  /** Jobs sharing a key run at most the key's limit at once (null: no key). */
  concurrencyKey: string | null;
  /**
   * The user who submitted the job from the app (their auth.users id), for jobs a signed-in
   * user submitted with `<schema>_public.client_enqueue()`; null for the others.
   */
  owner: string | null;
  /**
   * What the jobs it depended on (enqueued with `dependsOn`, or a Workflow's steps) ended
   * with, by id and by kind (dependencies.ts); empty for a job that depended on none.
   */
  dependencies: Dependencies;
}

export interface JobContext {
  job: Job;
  /**
   * Aborted when the job must stop: the drain's deadline, the isolate's CPU time nearly spent,
   * the function unloaded (the job goes back to the queue, its attempt not counted), or the
   * job's lease lost. Pass it to fetch() and other calls that can be cancelled, so the job
   * stops instead of running on, abandoned, or being cut off by the Edge runtime.
   */
  signal: AbortSignal;
  /**
   * Stores how far the job got (JSON, up to 64 KiB), readable by job id while it runs
   * (`job()`); each report replaces the one before. False when this attempt's lease was lost
   * (the job was given to another worker): nothing was stored, and the job's outcome will not
   * count either.
   */
  reportProgress(progress: Json): Promise<boolean>;
}

/**
 * A failure that retrying cannot fix (an invalid payload, a request the other side
 * refuses): the job goes to the dead letters at once instead of being retried.
 */
export class PermanentError extends Error {
  override name = "PermanentError";
}

/**
 * A failure whose message the job's owner reads (`my_jobs.error`), for kinds the app's users
 * submit: the job goes to the dead letters at once, as with PermanentError. Word it for them:
 * it is the only error they see (any other shows as none).
 */
export class UserFacingError extends PermanentError {
  override name = "UserFacingError";
}

/** The longest delay RetryAfter takes, in seconds. */
export const MAX_RETRY_SECONDS = 1e9;

/**
 * Throw this from a handler to fail the attempt and have the job tried again after `seconds`
 * instead of the kind's backoff: say, the Retry-After of an API that answered 429. The attempt
 * counts: after the job's last one it goes to the dead letters, as after any failure.
 * `message` is the job's last_error.
 */
export class RetryAfter extends Error {
  override name = "RetryAfter";
  readonly seconds: number;

  constructor(seconds: number, message?: string) {
    if (!(seconds >= 0 && seconds <= MAX_RETRY_SECONDS)) {
      throw new RangeError(
        `RetryAfter needs a delay of 0 to ${MAX_RETRY_SECONDS} seconds (about 31 years), ` +
          `got ${seconds}`,
      );
    }
    super(message ?? `retry after ${seconds}s`);
    this.seconds = seconds;
  }
}

/** How many times a job may snooze unless its Snooze says otherwise. */
export const DEFAULT_MAX_SNOOZES = 100;

/**
 * Throw this from a handler to have its job run again after `seconds` without spending an
 * attempt: the job is not ready yet (an export still being built, a payment not yet settled).
 * Not an error: nothing is recorded but the count of the job's snoozes (`job(id)`'s
 * `snoozes`). A job's snooze after `maxSnoozes` (1 to 10,000) fails it for good instead, with
 * an error that says so, so a job cannot snooze forever.
 */
export class Snooze extends Error {
  override name = "Snooze";
  readonly seconds: number;
  readonly maxSnoozes: number;

  constructor(seconds: number, maxSnoozes = DEFAULT_MAX_SNOOZES) {
    if (!(seconds >= 0 && seconds <= MAX_RETRY_SECONDS)) {
      throw new RangeError(
        `Snooze needs a delay of 0 to ${MAX_RETRY_SECONDS} seconds (about 31 years), got ${seconds}`,
      );
    }
    if (!(Number.isInteger(maxSnoozes) && maxSnoozes >= 1 && maxSnoozes <= 10_000)) {
      throw new RangeError(
        `Snooze's maxSnoozes must be a whole number from 1 to 10000, got ${maxSnoozes}`,
      );
    }
    super(`snooze for ${seconds}s`);
    this.seconds = seconds;
    this.maxSnoozes = maxSnoozes;
  }
}

/**
 * A kind's own delays between attempts: `base` seconds after the first failure, times
 * `factor` after each next one, at most `cap`; `jitter` is the share of each delay drawn at
 * random (0: none; 0.5, the database's own curve: a random point in the upper half), so jobs
 * that failed together spread out. Each field left out is the database's: 5 s, 10 s, 20 s, ...
 * up to an hour.
 */
export interface Backoff {
  base?: number;
  factor?: number;
  cap?: number;
  jitter?: number;
}

/** The database's backoff() curve, which a kind's Backoff starts from. */
export const DATABASE_BACKOFF: Readonly<Required<Backoff>> = {
  base: 5,
  factor: 2,
  cap: 3600,
  jitter: 0.5,
};

/** `backoff` with the database's values where it has none; throws a RangeError if invalid. */
export function checkBackoff(backoff: Backoff): Required<Backoff> {
  const full = { ...DATABASE_BACKOFF, ...backoff };
  const { base, factor, cap, jitter } = full;
  if (!(base > 0 && factor >= 1 && cap >= base && Number.isFinite(cap))) {
    throw new RangeError(
      `invalid backoff ${JSON.stringify(backoff)}: base must be positive, factor 1 or more ` +
        "and cap at least base (seconds)",
    );
  }
  if (!(jitter >= 0 && jitter <= 1)) {
    throw new RangeError(
      `invalid backoff ${JSON.stringify(backoff)}: jitter is a share of the delay, 0 to 1`,
    );
  }
  return full;
}

/** The pause (seconds) after failed attempt number `attempt` (1 for the first). */
export function backoffDelay(
  backoff: Backoff,
  attempt: number,
  random: () => number = Math.random,
): number {
  const { base, factor, cap, jitter } = checkBackoff(backoff);
  const full = Math.min(cap, base * factor ** (Math.max(attempt, 1) - 1));
  return full * (1 - jitter * random());
}

/** How a kind is run beyond its handler: its own backoff (default: the database's curve). */
export interface HandlerOptions {
  backoff?: Backoff;
}

/**
 * Runs one job; the payload is still unchecked JSON here. What it returns is the job's result
 * (JSON, up to `max_result_bytes`; undefined or null: none), stored when the job is done.
 */
export type JobHandler =
  & ((
    payload: unknown,
    context: JobContext,
  ) => Promise<unknown>)
  & {
    /** The kind's own delays between failed attempts; none: the database's backoff(). */
    readonly backoff?: Readonly<Required<Backoff>>;
  };

/** Job kind -> handler: the kinds this worker claims and how it runs them. */
export type HandlerMap = Readonly<Record<string, JobHandler>>;

/**
 * A handler for one job kind: the payload is validated with `schema` first (a Kind's payload
 * schema, when given a Kind: then `run` must return the Kind's result type), and a payload
 * that does not match fails the job for good, with zod's message as the job's last_error.
 * What `run` returns becomes the job's result. `options.backoff`: the kind's own delays
 * between failed attempts (e.g. `{ base: 30, factor: 3, cap: 1800, jitter: 0.2 }`).
 */
export function defineHandler<Payload extends z.ZodType, Result extends z.ZodType>(
  kind: Kind<Payload, Result>,
  run: (
    payload: z.output<Payload>,
    context: JobContext,
  ) => Promise<z.input<Result>> | z.input<Result>,
  options?: HandlerOptions,
): JobHandler;
export function defineHandler<Schema extends z.ZodType, Result>(
  schema: Schema,
  run: (payload: z.output<Schema>, context: JobContext) => Promise<Result> | Result,
  options?: HandlerOptions,
): JobHandler;
export function defineHandler(
  schemaOrKind: z.ZodType | Kind<z.ZodType, z.ZodType>,
  run: (payload: unknown, context: JobContext) => unknown,
  options: HandlerOptions = {},
): JobHandler {
  // A Kind (dependencies.ts): its payload schema, and its result type for `run` to return.
  const schema = "result" in schemaOrKind && "payload" in schemaOrKind
    ? schemaOrKind.payload
    : schemaOrKind as z.ZodType;
  const handler: JobHandler = async (payload, context) => {
    const parsed = schema.safeParse(payload);
    if (!parsed.success) {
      throw new PermanentError(
        `invalid payload for ${context.job.kind}:\n${z.prettifyError(parsed.error)}`,
      );
    }
    return await run(parsed.data, context);
  };
  return options.backoff === undefined ? handler : withBackoff(handler, options.backoff);
}

/**
 * `handler` with its kind's own backoff, for handlers/mod.ts:
 * `sync_crm: withBackoff(syncCrm, { base: 30, cap: 1800 })`.
 */
export function withBackoff(handler: JobHandler, backoff: Backoff): JobHandler {
  const full = Object.freeze(checkBackoff(backoff));
  const run: JobHandler = (payload, context) => handler(payload, context);
  return Object.assign(run, { backoff: full });
}

/**
 * The pause (seconds) before the next attempt of a job of `kind` whose attempt number
 * `attempt` failed with `error`: a RetryAfter's, else the kind's own backoff, else undefined
 * (the database's backoff()).
 */
export function retryDelay(
  handlers: HandlerMap,
  kind: string,
  attempt: number,
  error: unknown,
): number | undefined {
  if (error instanceof RetryAfter) return error.seconds;
  const backoff = Object.hasOwn(handlers, kind) ? handlers[kind].backoff : undefined;
  return backoff === undefined ? undefined : backoffDelay(backoff, attempt);
}
