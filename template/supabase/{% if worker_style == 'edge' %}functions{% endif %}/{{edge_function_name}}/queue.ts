// Machinery: the queue's SQL functions, called through the Data API (PostgREST RPC) with
// supabase-js. Every state change presents the lock token the claim handed out, so a job
// whose lease was given to another worker is never overwritten by this one.
import { createClient } from "@supabase/supabase-js";
import type { Settings } from "./settings.ts";

/** A claimed row of the jobs table (the columns the worker uses). */
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

export interface ClaimOptions {
  worker: string;
  queue: string;
  kinds: string[];
  maxJobs: number;
  /** Omitted: the lease configured in the database. */
  leaseSeconds?: number;
}

/** The job's status after fail(): queued again, dead-lettered, or null when stale. */
export type FailOutcome = "queued" | "failed" | null;

export interface Queue {
  claim(options: ClaimOptions): Promise<ClaimedJob[]>;
  /** Marks the jobs done; returns the ids that were (a stale token's job is left out). */
  completeMany(jobs: readonly ClaimedJob[]): Promise<number[]>;
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
    claim: ({ worker, queue, kinds, maxJobs, leaseSeconds }) =>
      call<ClaimedJob[]>("claim", {
        worker,
        queue,
        kinds,
        max_jobs: maxJobs,
        ...(leaseSeconds === undefined ? {} : { lease_seconds: leaseSeconds }),
      }),
    checkin: (worker, queue, kinds) => call<void>("checkin", { worker, queue, kinds }),
    completeMany: (jobs) =>
      call<number[]>("complete_many", {
        job_ids: jobs.map((job) => job.id),
        lock_tokens: jobs.map((job) => job.lock_token),
      }),
    fail: (job, error, retryable) =>
      call<FailOutcome>("fail", {
        job_id: job.id,
        lock_token: job.lock_token,
        error,
        retryable,
      }),
  };
}
