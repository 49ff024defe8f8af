// Machinery: what a handler is. Handlers in handlers/ are built with defineHandler() and
// may throw PermanentError; the worker (worker.ts) does the rest.
import { z } from "zod";

/** The job a handler is running. */
export interface Job {
  id: number;
  kind: string;
  queue: string;
  /** 1 for the first attempt. */
  attempt: number;
  maxAttempts: number;
}

export interface JobContext {
  job: Job;
  /**
   * Aborted when the function's time budget runs out: pass it to fetch() and other calls
   * that can be cancelled, so a slow call fails (and is retried later) instead of being cut
   * off by the Edge runtime.
   */
  signal: AbortSignal;
}

/**
 * A failure that retrying cannot fix (an invalid payload, a request the other side
 * refuses): the job goes to the dead letters at once instead of being retried.
 */
export class PermanentError extends Error {
  override name = "PermanentError";
}

/** Runs one job; the payload is still unchecked JSON here. */
export type JobHandler = (
  payload: unknown,
  context: JobContext,
) => Promise<void>;

/** Job kind -> handler: the kinds this worker claims and how it runs them. */
export type HandlerMap = Readonly<Record<string, JobHandler>>;

/**
 * A handler for one job kind: the payload is validated with `schema` first, and a payload
 * that does not match fails the job for good, with zod's message as the job's last_error.
 */
export function defineHandler<Schema extends z.ZodType>(
  schema: Schema,
  run: (payload: z.output<Schema>, context: JobContext) => Promise<void> | void,
): JobHandler {
  return async (payload, context) => {
    const parsed = schema.safeParse(payload);
    if (!parsed.success) {
      throw new PermanentError(
        `invalid payload for ${context.job.kind}:\n${z.prettifyError(parsed.error)}`,
      );
    }
    await run(parsed.data, context);
  };
}
