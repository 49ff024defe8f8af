// Machinery: the HTTP side. The database's wake-up (pg_net) is a POST with
// `Authorization: Bearer <service key>` and a body like {"reason": "enqueue", "queues":
// ["default"]}. The reply (202) goes out at once; the jobs run after it, for as long as the
// Edge runtime keeps the function alive for them (EdgeRuntime.waitUntil). An instance runs
// one drain at a time: a wake-up during a drain joins it (pg_net sends its wake-ups in
// batches, all at once), and one while a drain winds down starts the next when it ends. When
// the runtime unloads the function (`beforeunload`), the drain releases its running jobs.
// `GET .../metrics`, with the service key, answers the queue's metrics in Prometheus' text
// format.
import { bearerCheck } from "./auth.ts";
import { type Clock, systemClock } from "./clock.ts";
import type { HandlerMap } from "./job.ts";
import { formatPrometheus, PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { MetricSample, WorkerQueue } from "./queue.ts";
import { FUNCTION_NAME, type Settings } from "./settings.ts";
import { describe } from "./run_job.ts";
import { type Drain, type DrainSummary, type LogEvent, logJson, startDrain } from "./worker.ts";

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
  /**
   * Registers what to do when the runtime unloads the function; defaults to a `beforeunload`
   * listener, which the Edge runtime dispatches before it shuts an isolate down.
   */
  onUnload?: (listener: () => void) => void;
  clock?: Clock;
  /**
   * When the isolate started, on `clock`. Default 0: the system clock is performance.now(),
   * which counts from the isolate's start, before this module was even loaded.
   */
  isolateStartedAt?: number;
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
  const clock = options.clock ?? systemClock;
  const isolateStartedAt = options.isolateStartedAt ?? 0;
  // Metrics are read with their own token, or a service key when there is none; a wake-up
  // presents the wake-up secret only.
  const isScraper = bearerCheck(
    settings.metricsToken ? [settings.metricsToken] : settings.serviceKeys,
  );
  const scrapeWith = settings.metricsToken
    ? "`Authorization: Bearer <metrics token>` (PGQUEUE_METRICS_TOKEN)"
    : "`Authorization: Bearer <service key>` (the key this function runs with)";
  const isWakeUp = bearerCheck([settings.wakeSecret]);
  const workerId = `${FUNCTION_NAME}:${crypto.randomUUID().slice(0, 8)}`;
  // The drain under way, with its work as handed to waitUntil; and the wake-ups that came
  // while it wound down, for the drain that starts when it ends.
  let current: { drain: Drain; work: Promise<void> } | undefined;
  let next: { queues: Set<string>; reasons: string[]; work: Promise<void> } | undefined;
  let unloading = false;
  (options.onUnload ?? ((listener) => addEventListener("beforeunload", listener)))(() => {
    unloading = true;
    current?.drain.unload();
  });

  function begin(wake: Wake): { drain: Drain; work: Promise<void> } {
    const drain = startDrain(wake.queues, {
      queue: options.queue,
      handlers,
      workerId,
      batchSize: settings.batchSize,
      maxJobsInFlight: settings.maxJobsInFlight,
      leaseSeconds: settings.leaseSeconds,
      timeBudgetMs: settings.timeBudgetMs,
      wallClockLimitMs: settings.wallClockLimitMs,
      isolateStartedAt,
      lingerMs: settings.lingerMs,
      lingerPollMs: settings.lingerPollMs,
      clock,
      log,
    });
    if (unloading) drain.unload();
    const work = drain.done.then((summary) => {
      log({ event: "drain.end", reason: wake.reason, queues: drain.queues, ...summary });
      options.onDrained?.(summary);
    }).catch((error) => log({ event: "drain.error", error: describe(error) }))
      .finally(() => {
        if (current?.drain === drain) current = undefined;
      });
    current = { drain, work };
    return current;
  }

  /** Joins the drain under way, or starts one; the work to hand to waitUntil. */
  function wakeUp(wake: Wake): { work: Promise<void>; joined: boolean } {
    if (current === undefined) return { work: begin(wake).work, joined: false };
    if (current.drain.join(wake.queues)) return { work: current.work, joined: true };
    // The drain under way stopped claiming and is reporting its last jobs: the next one
    // starts when it ends, with every wake-up that came meanwhile.
    if (next === undefined) {
      const queues = new Set(wake.queues);
      const reasons = [wake.reason];
      const work = current.work.then(() => {
        next = undefined;
        return begin({ reason: reasons.join(","), queues: [...queues] }).work;
      });
      next = { queues, reasons, work };
    } else {
      for (const queue of wake.queues) next.queues.add(queue);
      next.reasons.push(wake.reason);
    }
    return { work: next.work, joined: true };
  }

  async function serveMetrics(request: Request): Promise<Response> {
    if (!(await isScraper(request.headers.get("authorization")))) {
      return reply(401, {
        error: `Unauthorized: scrape with ${scrapeWith}.`,
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

    const { work, joined } = wakeUp(wake);
    waitUntil?.(work);
    return reply(202, { accepted: true, queues: wake.queues, worker: workerId, joined });
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
