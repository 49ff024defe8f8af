// Machinery: what a handler is. Handlers in handlers/ are built with defineHandler(), may
// return a result and report progress, and may throw PermanentError; the worker (worker.ts)
// does the rest.
import { z } from "zod";
import type { Json } from "./queue.ts";

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

/**
 * Runs one job; the payload is still unchecked JSON here. What it returns is the job's result
 * (JSON, up to `max_result_bytes`; undefined or null: none), stored when the job is done.
 */
export type JobHandler = (
  payload: unknown,
  context: JobContext,
) => Promise<unknown>;

/** Job kind -> handler: the kinds this worker claims and how it runs them. */
export type HandlerMap = Readonly<Record<string, JobHandler>>;

/**
 * A handler for one job kind: the payload is validated with `schema` first, and a payload
 * that does not match fails the job for good, with zod's message as the job's last_error.
 * What `run` returns becomes the job's result.
 */
export function defineHandler<Schema extends z.ZodType, Result>(
  schema: Schema,
  run: (payload: z.output<Schema>, context: JobContext) => Promise<Result> | Result,
): JobHandler {
  return async (payload, context) => {
    const parsed = schema.safeParse(payload);
    if (!parsed.success) {
      throw new PermanentError(
        `invalid payload for ${context.job.kind}:\n${z.prettifyError(parsed.error)}`,
      );
    }
    return await run(parsed.data, context);
  };
}
