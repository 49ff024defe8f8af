// Test helpers (exported by testing.ts): a fake Data API on 127.0.0.1 that records the jobs
// enqueued through it, and assertions on them. Code under test enqueues with the real queue
// client (queue.ts), pointed at the fake: `api.queue`, or `supabaseQueue(api.connection)`.
//
//   await withFakeDataApi(async (api) => {
//     await signUp(api.queue, "ada@example.com");
//     assertEnqueued(api, { kind: "send_email", payload: { to: "ada@example.com" } });
//   });
//
// It answers enqueue() and enqueue_many() (ids from 1 up) and refuses every other call, naming
// it: only what was enqueued is recorded, nothing runs.
import assert from "node:assert/strict";
import { isDeepStrictEqual } from "node:util";
import { type Json, type Queue, type QueueConnection, supabaseQueue } from "./queue.ts";

/** A job as enqueued: what the code under test asked for, with the database's defaults. */
export interface EnqueuedJob {
  id: number;
  kind: string;
  payload: Json;
  queue: string;
  /** When it may run: the time asked for, or the time of the call. */
  runAfter: Date;
  priority: number;
  idempotencyKey: string | null;
  concurrencyKey: string | null;
  maxAttempts: number | null;
}

export interface FakeDataApi {
  /** The real queue client (queue.ts), talking to this fake. */
  queue: Queue;
  /** What supabaseQueue() needs to reach it (URL, service key, schema). */
  connection: QueueConnection;
  /** The jobs enqueued so far, in order. */
  enqueued: EnqueuedJob[];
}

/** What assertEnqueued() looks for: every field given must match. */
export interface JobFilter {
  kind: string;
  /** These keys with these values (deep equality); others are allowed. */
  payload?: Record<string, unknown>;
  queue?: string;
  /** Within `toleranceMs` (default 1000) of this time. */
  runAfter?: Date;
  toleranceMs?: number;
}

/** Runs `test` with a fake Data API that records enqueued jobs; shuts it down after. */
export async function withFakeDataApi(test: (api: FakeDataApi) => Promise<void>): Promise<void> {
  const enqueued: EnqueuedJob[] = [];
  const record = (args: Record<string, unknown>): number => {
    const id = enqueued.length + 1;
    enqueued.push(toEnqueued(id, args));
    return id;
  };
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const name = new URL(request.url).pathname.replace("/rest/v1/", "");
    if (request.method === "POST" && name === "rpc/enqueue") {
      return Response.json(record(await request.json()));
    }
    if (request.method === "POST" && name === "rpc/enqueue_many") {
      const { jobs } = await request.json() as { jobs: Record<string, unknown>[] };
      return Response.json(jobs.map(record));
    }
    await request.body?.cancel();
    return Response.json({
      code: "PGRST202",
      message: `the fake Data API (testing.ts) records enqueue() and enqueue_many() only, ` +
        `not ${request.method} ${name}`,
      details: null,
      hint: "test that call against the test database instead",
    }, { status: 404 });
  });
  const connection: QueueConnection = {
    supabaseUrl: `http://127.0.0.1:${server.addr.port}`,
    serviceKeys: ["fake-service-key"],
    schema: "pgqueue",
  };
  try {
    await test({ queue: supabaseQueue(connection), connection, enqueued });
  } finally {
    await server.shutdown();
  }
}

function toEnqueued(id: number, args: Record<string, unknown>): EnqueuedJob {
  return {
    id,
    kind: String(args.kind),
    payload: (args.payload ?? {}) as Json,
    queue: (args.queue as string | undefined) ?? "default",
    runAfter: args.run_after === undefined ? new Date() : new Date(String(args.run_after)),
    priority: (args.priority as number | undefined) ?? 0,
    idempotencyKey: (args.idempotency_key as string | undefined) ?? null,
    concurrencyKey: (args.concurrency_key as string | undefined) ?? null,
    maxAttempts: (args.max_attempts as number | undefined) ?? null,
  };
}

function matches(job: EnqueuedJob, wanted: JobFilter): boolean {
  const payload = (typeof job.payload === "object" && job.payload !== null &&
      !Array.isArray(job.payload))
    ? job.payload as Record<string, unknown>
    : {};
  const tolerance = wanted.toleranceMs ?? 1000;
  return job.kind === wanted.kind &&
    (wanted.queue === undefined || job.queue === wanted.queue) &&
    Object.entries(wanted.payload ?? {}).every(([key, value]) =>
      Object.hasOwn(payload, key) && isDeepStrictEqual(payload[key], value)
    ) &&
    (wanted.runAfter === undefined ||
      Math.abs(job.runAfter.getTime() - wanted.runAfter.getTime()) <= tolerance);
}

function describeFilter(wanted: JobFilter): string {
  const parts = [`kind "${wanted.kind}"`];
  if (wanted.payload !== undefined) {
    parts.push(`a payload holding ${JSON.stringify(wanted.payload)}`);
  }
  if (wanted.queue !== undefined) parts.push(`queue "${wanted.queue}"`);
  if (wanted.runAfter !== undefined) {
    parts.push(`runAfter ${wanted.runAfter.toISOString()} (± ${wanted.toleranceMs ?? 1000} ms)`);
  }
  return parts.join(", ");
}

function describeJob(job: EnqueuedJob): string {
  return `#${job.id} ${job.kind} on "${job.queue}", runAfter ${job.runAfter.toISOString()}: ` +
    JSON.stringify(job.payload);
}

function listed(jobs: readonly EnqueuedJob[]): string {
  return jobs.map((job) => `  ${describeJob(job)}`).join("\n") || "  none";
}

function jobsOf(from: FakeDataApi | readonly EnqueuedJob[]): readonly EnqueuedJob[] {
  return Array.isArray(from) ? from : (from as FakeDataApi).enqueued;
}

/**
 * The first job enqueued through `from` that matches `wanted`; fails the test if none does,
 * listing every job enqueued.
 */
export function assertEnqueued(
  from: FakeDataApi | readonly EnqueuedJob[],
  wanted: JobFilter,
): EnqueuedJob {
  const jobs = jobsOf(from);
  const found = jobs.find((job) => matches(job, wanted));
  if (found === undefined) {
    throw new assert.AssertionError({
      message: `no job enqueued with ${describeFilter(wanted)}; the jobs enqueued:\n` +
        listed(jobs),
    });
  }
  return found;
}

/** Fails the test if a job enqueued through `from` matches `wanted`, naming those that do. */
export function refuteEnqueued(
  from: FakeDataApi | readonly EnqueuedJob[],
  wanted: JobFilter,
): void {
  const found = jobsOf(from).filter((job) => matches(job, wanted));
  if (found.length > 0) {
    throw new assert.AssertionError({
      message: `expected no job enqueued with ${describeFilter(wanted)}; enqueued:\n` +
        listed(found),
    });
  }
}
