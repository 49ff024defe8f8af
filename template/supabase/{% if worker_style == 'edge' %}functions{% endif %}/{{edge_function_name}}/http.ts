// Machinery: the HTTP side. The database's wake-up (pg_net) is a POST of a body like
// {"reason": "enqueue", "queues": ["default"]}, signed with the wake-up secret as Standard
// Webhooks says (headers webhook-id, webhook-timestamp, webhook-signature; the secret itself
// is never sent). auth.ts checks it: an unsigned, stale, replayed or wrongly signed one is
// refused (401/403), and logged once a minute at most with what to check. The reply (202) goes
// out at once; the jobs run after it, for as long as the
// Edge runtime keeps the function alive for them (EdgeRuntime.waitUntil). An instance runs
// one drain at a time: a wake-up during a drain joins it (pg_net sends its wake-ups in
// batches, all at once), and one while a drain winds down starts the next when it ends. When
// the runtime unloads the function (`beforeunload`), the drain releases its running jobs. The
// isolate's CPU budget (cpu.ts) is one for all its drains: the runtime counts CPU per isolate.
// `GET .../metrics`, with the service key, answers the queue's metrics in Prometheus' text
// format.
import { bearerCheck, wakeUpCheck } from "./auth.ts";
import { type Clock, systemClock } from "./clock.ts";
import { CpuBudget, LoopMeter } from "./cpu.ts";
import type { HandlerMap } from "./job.ts";
import { formatPrometheus, PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { MetricSample, WorkerQueue } from "./queue.ts";
import { FUNCTION_NAME, type Settings } from "./settings.ts";
import { describe } from "./run_job.ts";
import { type LogEvent, logJson } from "./log.ts";
import { type Drain, type DrainSummary, startDrain } from "./worker.ts";

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
   * Registers what to do when the runtime unloads the function, and why (its reason: "cpu",
   * "memory", "wall_clock", ...); defaults to a `beforeunload` listener, which the Edge
   * runtime dispatches at 90% of its CPU, memory and wall-clock limits.
   */
  onUnload?: (listener: (reason?: string) => void) => void;
  /** The isolate's CPU budget; default: one on a LoopMeter, with the settings' limits. */
  cpu?: CpuBudget;
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

/** The Edge runtime's `beforeunload`, with its `detail.reason` ("cpu", "memory", ...). */
function onBeforeUnload(listener: (reason?: string) => void): void {
  addEventListener("beforeunload", (event) => {
    const detail = (event as CustomEvent<{ reason?: unknown } | null>).detail;
    listener(typeof detail?.reason === "string" ? detail.reason : undefined);
  });
}

function edgeRuntimeWaitUntil(): ((work: Promise<unknown>) => void) | undefined {
  return typeof EdgeRuntime === "undefined" ? undefined : (work) => EdgeRuntime?.waitUntil(work);
}

export function createWakeHandler(
  options: WakeHandlerOptions,
): (request: Request) => Promise<Response> {
  const log = options.log ?? logJson;
  const waitUntil = options.waitUntil ?? edgeRuntimeWaitUntil();
  const workerId = `${FUNCTION_NAME}:${crypto.randomUUID().slice(0, 8)}`;
  const drains = new Drains(options, workerId, log);
  (options.onUnload ?? onBeforeUnload)((reason) => drains.unload(reason));
  const serveMetrics = metricsEndpoint(options, log);
  // A wake-up is signed with the wake-up secret, and with nothing else.
  const wakeUp = wakeUpCheck(options.settings.wakeSecret, {
    schema: options.settings.schema,
    log,
  });

  return async (request) => {
    if (request.method === "GET" && new URL(request.url).pathname.endsWith("/metrics")) {
      return await serveMetrics(request);
    }
    if (request.method !== "POST") {
      return reply(405, { error: "Use POST to wake the worker (or GET .../metrics)." }, {
        Allow: "POST",
      });
    }
    const signed = wakeUp.signed(request.headers);
    if (!signed.ok) {
      await request.body?.cancel();
      return refused(signed);
    }
    const body = await request.text();
    const checked = wakeUp.check(body, request.headers);
    if (!checked.ok) return refused(checked);
    let wake: Wake;
    try {
      wake = parseWake(body);
    } catch (error) {
      return reply(400, { error: (error as Error).message });
    }

    const { work, joined } = drains.wakeUp(wake);
    waitUntil?.(work);
    return reply(202, { accepted: true, queues: wake.queues, worker: workerId, joined });
  };
}

/**
 * The instance's drains, one at a time: a wake-up joins the drain under way, or, while that
 * one winds down, waits with the others that come meanwhile for the next.
 */
class Drains {
  private readonly options: WakeHandlerOptions;
  private readonly workerId: string;
  private readonly log: (event: LogEvent) => void;
  // The drain under way, with its work as handed to waitUntil; and the wake-ups that came
  // while it wound down, for the drain that starts when it ends.
  private current: { drain: Drain; work: Promise<void> } | undefined;
  private next: { queues: Set<string>; reasons: string[]; work: Promise<void> } | undefined;
  private unloading: { reason?: string } | undefined;
  private readonly cpu: CpuBudget;

  constructor(options: WakeHandlerOptions, workerId: string, log: (event: LogEvent) => void) {
    this.options = options;
    this.workerId = workerId;
    this.log = log;
    const { settings } = options;
    this.cpu = options.cpu ?? new CpuBudget(new LoopMeter(), {
      softLimitMs: settings.cpuSoftLimitMs,
      hardLimitMs: settings.cpuHardLimitMs,
      heavyKinds: settings.cpuHeavyKinds,
      heavyPerIsolate: settings.cpuHeavyPerIsolate,
    });
  }

  /** The runtime is unloading the function: the drain under way, and any later, stop. */
  unload(reason?: string): void {
    this.unloading = { reason };
    this.current?.drain.unload(reason);
  }

  /** Joins the drain under way, or starts one; the work to hand to waitUntil. */
  wakeUp(wake: Wake): { work: Promise<void>; joined: boolean } {
    const current = this.current;
    if (current === undefined) return { work: this.begin(wake).work, joined: false };
    if (current.drain.join(wake.queues)) return { work: current.work, joined: true };
    // The drain under way stopped claiming and is reporting its last jobs: the next one
    // starts when it ends, with every wake-up that came meanwhile.
    if (this.next === undefined) {
      const queues = new Set(wake.queues);
      const reasons = [wake.reason];
      const work = current.work.then(() => {
        this.next = undefined;
        return this.begin({ reason: reasons.join(","), queues: [...queues] }).work;
      });
      this.next = { queues, reasons, work };
    } else {
      for (const queue of wake.queues) this.next.queues.add(queue);
      this.next.reasons.push(wake.reason);
    }
    return { work: this.next.work, joined: true };
  }

  private begin(wake: Wake): { drain: Drain; work: Promise<void> } {
    const { settings } = this.options;
    const drain = startDrain(wake.queues, {
      queue: this.options.queue,
      handlers: this.options.handlers,
      workerId: this.workerId,
      batchSize: settings.batchSize,
      maxJobsInFlight: settings.maxJobsInFlight,
      leaseSeconds: settings.leaseSeconds,
      timeBudgetMs: settings.timeBudgetMs,
      wallClockLimitMs: settings.wallClockLimitMs,
      isolateStartedAt: this.options.isolateStartedAt ?? 0,
      lingerMs: settings.lingerMs,
      lingerPollMs: settings.lingerPollMs,
      cpu: this.cpu,
      clock: this.options.clock ?? systemClock,
      log: this.log,
      logLevel: settings.logLevel,
    });
    if (this.unloading) drain.unload(this.unloading.reason);
    const work = drain.done.then((summary) => {
      this.log({ event: "drain.end", reason: wake.reason, queues: drain.queues, ...summary });
      this.options.onDrained?.(summary);
    }).catch((error) => this.log({ event: "drain.error", error: describe(error) }))
      .finally(() => {
        if (this.current?.drain === drain) this.current = undefined;
      });
    this.current = { drain, work };
    return this.current;
  }
}

/** `GET .../metrics`: the queue's metrics, for a scraper that presents its token. */
function metricsEndpoint(
  options: WakeHandlerOptions,
  log: (event: LogEvent) => void,
): (request: Request) => Promise<Response> {
  const { settings } = options;
  // Metrics are read with their own token, or a service key when there is none.
  const isScraper = bearerCheck(
    settings.metricsToken ? [settings.metricsToken] : settings.serviceKeys,
  );
  const scrapeWith = settings.metricsToken
    ? "`Authorization: Bearer <metrics token>` (PGQUEUE_METRICS_TOKEN)"
    : "`Authorization: Bearer <service key>` (the key this function runs with)";
  return async (request) => {
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

/** The answer to a wake-up refused by auth.ts. */
function refused(check: { status: number; reason: string }): Response {
  return reply(check.status, {
    error: `Wake-up refused (${check.reason}): the database signs its wake-ups with the ` +
      "wake-up secret (Standard Webhooks), which this function must run with too " +
      "(PGQUEUE_WAKE_SECRET).",
  });
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
