// Machinery: the queue's SQL functions, called through the Data API (PostgREST RPC) with
// supabase-js. Every state change presents the lock token the claim handed out, so a job
// whose lease was given to another worker is never overwritten by this one.
import { createClient } from "@supabase/supabase-js";
import type { Settings } from "./settings.ts";

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
}

export interface CompleteAndClaimOptions {
  worker: string;
  /** Jobs that ran to the end: each is marked done, unless its lease went to another worker. */
  done: readonly ClaimedJob[];
  queue: string;
  kinds: string[];
  /** How many jobs to claim; 0 only completes `done`. */
  maxJobs: number;
  /** Omitted: the lease configured in the database. */
  leaseSeconds?: number;
}

/** The job's status after fail(): queued again, dead-lettered, or null when stale. */
export type FailOutcome = "queued" | "failed" | null;

export interface Queue {
  /**
   * Completes the jobs `done` and claims the next batch, in one call and one transaction.
   * A job whose lock token is stale (its lease was lost) is left to its new owner.
   */
  completeAndClaim(options: CompleteAndClaimOptions): Promise<ClaimedJob[]>;
  fail(
    job: ClaimedJob,
    error: string,
    retryable: boolean,
  ): Promise<FailOutcome>;
  /** Tells the database that `worker` claims `kinds` from `queue` (the `unclaimed` view). */
  checkin(worker: string, queue: string, kinds: string[]): Promise<void>;
}

export class QueueError extends Error {
  override name = "QueueError";
}

export function supabaseQueue(settings: Settings): Queue {
  const client = createClient(settings.supabaseUrl, settings.serviceKeys[0], {
    auth: {
      persistSession: false,
      autoRefreshToken: false,
      detectSessionInUrl: false,
    },
  });
  const db = client.schema(settings.schema);

  async function call<T>(fn: string, args: Record<string, unknown>) {
    const { data, error } = await db.rpc(fn, args);
    if (error) {
      throw new QueueError(
        `${settings.schema}.${fn}() failed through ${settings.supabaseUrl}: ` +
          `${error.message}${error.hint ? ` (hint: ${error.hint})` : ""}`,
      );
    }
    return data as T;
  }

  return {
    completeAndClaim: async ({ worker, done, queue, kinds, maxJobs, leaseSeconds }) => {
      const rows = await call<Omit<ClaimedJob, "queue">[]>("complete_and_claim", {
        worker,
        done_ids: done.map((job) => job.id),
        done_tokens: done.map((job) => job.lock_token),
        max_jobs: maxJobs,
        kinds,
        queue,
        ...(leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds }),
      });
      return rows.map((row) => ({ ...row, queue }));
    },
    checkin: (worker, queue, kinds) => call<void>("checkin", { worker, queue, kinds }),
    fail: (job, error, retryable) =>
      call<FailOutcome>("fail", {
        job_id: job.id,
        lock_token: job.lock_token,
        error,
        retryable,
      }),
  };
}
