// Machinery: the HTTP side. The database's wake-up (pg_net) is a POST with
// `Authorization: Bearer <service key>` and a body like {"reason": "enqueue", "queues":
// ["default"]}. The reply (202) goes out at once; the jobs run after it, for as long as the
// Edge runtime keeps the function alive for them (EdgeRuntime.waitUntil). A wake-up that
// finds this instance lingering over the same queues joins that drain instead of starting
// another one. `GET .../metrics`, with the same key, answers the queue's metrics in
// Prometheus' text format.
import { bearerCheck } from "./auth.ts";
import type { HandlerMap } from "./job.ts";
import { formatPrometheus, PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { MetricSample, WorkerQueue } from "./queue.ts";
import { FUNCTION_NAME, type Settings } from "./settings.ts";
import {
  describe,
  type Drain,
  type DrainSummary,
  type LogEvent,
  logJson,
  startDrain,
} from "./worker.ts";

export interface WakeHandlerOptions {
  settings: Settings;
  queue: WorkerQueue;
  handlers: HandlerMap;
  /**
   * Keeps the function alive until `work` settles. Defaults to the Edge runtime's
   * EdgeRuntime.waitUntil; elsewhere (plain `deno run`) the work simply goes on.
   */
  waitUntil?: (work: Promise<unknown>) => void;
  log?: (event: LogEvent) => void;
  /** Called with each wake-up's summary once its work is over. */
  onDrained?: (summary: DrainSummary) => void;
  /** Reads the queue's metrics for `GET .../metrics` (Queue.metrics); without it, 404. */
  metrics?: () => Promise<MetricSample[]>;
}

declare const EdgeRuntime:
  | { waitUntil(work: Promise<unknown>): void }
  | undefined;

function edgeRuntimeWaitUntil(): ((work: Promise<unknown>) => void) | undefined {
  return typeof EdgeRuntime === "undefined" ? undefined : (work) => EdgeRuntime?.waitUntil(work);
}

export function createWakeHandler(
  options: WakeHandlerOptions,
): (request: Request) => Promise<Response> {
  const { settings, handlers } = options;
  const log = options.log ?? logJson;
  const waitUntil = options.waitUntil ?? edgeRuntimeWaitUntil();
  // Metrics are read with the service key; a wake-up presents the wake-up secret only.
  const isAuthorized = bearerCheck(settings.serviceKeys);
  const isWakeUp = bearerCheck([settings.wakeSecret]);
  const workerId = `${FUNCTION_NAME}:${crypto.randomUUID().slice(0, 8)}`;
  // The drains under way in this instance, each with its work as handed to waitUntil.
  const drains = new Map<Drain, Promise<void>>();

  async function serveMetrics(request: Request): Promise<Response> {
    if (!(await isAuthorized(request.headers.get("authorization")))) {
      return reply(401, {
        error: "Unauthorized: scrape with `Authorization: Bearer <service key>` (the key " +
          "this function runs with).",
      }, { "WWW-Authenticate": 'Bearer realm="metrics"' });
    }
    if (!options.metrics) {
      return reply(404, { error: "This handler was created without a metrics source." });
    }
    try {
      const samples = await options.metrics();
      return new Response(formatPrometheus(samples), {
        status: 200,
        headers: { "Content-Type": PROMETHEUS_CONTENT_TYPE },
      });
    } catch (error) {
      // A failed scrape (not an empty one), so that Prometheus marks the target down.
      log({ event: "metrics.error", error: describe(error) });
      return reply(503, { error: `Cannot read the queue's metrics: ${describe(error, false)}` });
    }
  }

  return async (request) => {
    if (request.method === "GET" && new URL(request.url).pathname.endsWith("/metrics")) {
      return await serveMetrics(request);
    }
    if (request.method !== "POST") {
      return reply(405, { error: "Use POST to wake the worker (or GET .../metrics)." }, {
        Allow: "POST",
      });
    }
    if (!(await isWakeUp(request.headers.get("authorization")))) {
      await request.body?.cancel();
      return reply(403, {
        error: "Forbidden: send `Authorization: Bearer <wake-up secret>` with the secret " +
          "this function runs with (PGQUEUE_WAKE_SECRET).",
      });
    }
    let wake: Wake;
    try {
      wake = parseWake(await request.text());
    } catch (error) {
      return reply(400, { error: (error as Error).message });
    }

    for (const [running, work] of drains) {
      if (wake.queues.every((queue) => running.queues.includes(queue)) && running.join()) {
        waitUntil?.(work);
        return reply(202, { accepted: true, queues: wake.queues, worker: workerId, joined: true });
      }
    }
    const started = startDrain(wake.queues, {
      queue: options.queue,
      handlers,
      workerId,
      batchSize: settings.batchSize,
      leaseSeconds: settings.leaseSeconds,
      timeBudgetMs: settings.timeBudgetMs,
      lingerMs: settings.lingerMs,
      lingerPollMs: settings.lingerPollMs,
      log,
    });
    const work = started.done.then((summary) => {
      log({ event: "drain.end", reason: wake.reason, queues: wake.queues, ...summary });
      options.onDrained?.(summary);
    }).catch((error) => log({ event: "drain.error", error: describe(error) }))
      .finally(() => drains.delete(started));
    drains.set(started, work);
    waitUntil?.(work);
    return reply(202, { accepted: true, queues: wake.queues, worker: workerId, joined: false });
  };
}

interface Wake {
  reason: string;
  queues: string[];
}

/** The wake-up's body; an empty body (e.g. a manual curl) means the default queue. */
export function parseWake(body: string): Wake {
  const usage = 'The body must be empty or JSON like {"queues": ["default"]}';
  if (body.trim() === "") return { reason: "manual", queues: ["default"] };
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    throw new Error(`${usage}; it is not JSON.`);
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Error(`${usage}; got ${body.slice(0, 200)}`);
  }
  const { reason, queues } = parsed as Record<string, unknown>;
  if (queues === undefined || queues === null) {
    return { reason: String(reason ?? "manual"), queues: ["default"] };
  }
  if (
    !Array.isArray(queues) || queues.length === 0 ||
    !queues.every((queue) => typeof queue === "string" && queue !== "")
  ) {
    throw new Error(`${usage}; "queues" must be a list of queue names.`);
  }
  return { reason: String(reason ?? "manual"), queues };
}

function reply(
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", ...headers },
  });
}
