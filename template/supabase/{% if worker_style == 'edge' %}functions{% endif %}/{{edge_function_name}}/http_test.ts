import assert from "node:assert/strict";
import { Webhook } from "standardwebhooks";
import { z } from "zod";
import { createWakeHandler, parseWake } from "./http.ts";
import { defineHandler } from "./job.ts";
import type { Settings } from "./settings.ts";
import { FakeClock, MemoryQueue } from "./testing.ts";
import { PROMETHEUS_CONTENT_TYPE } from "./metrics.ts";
import type { MetricSample } from "./queue.ts";
import type { LogEvent } from "./log.ts";
import type { DrainSummary } from "./worker.ts";

const settings: Settings = {
  supabaseUrl: "http://127.0.0.1:54321",
  serviceKeys: ["service-key"],
  wakeSecret: `whsec_${btoa("wake-secret-of-the-tests")}`,
  schema: "pgqueue",
  batchSize: 10,
  maxJobsInFlight: 10,
  timeBudgetMs: 10_000,
  wallClockLimitMs: 150_000,
  leaseSeconds: 60,
  lingerMs: 0,
  lingerPollMs: 10,
  cpuSoftLimitMs: 1000,
  cpuHardLimitMs: 2000,
  cpuHeavyKinds: [],
  cpuHeavyPerIsolate: 1,
  logLevel: "info",
};

const handlers = { ok: defineHandler(z.object({}), () => {}) };

const BODY = '{"reason":"enqueue","queues":["default"]}';

/** The headers of a wake-up of `body` signed with `secret` (now, with a new id, unless told). */
function signed(
  body: string,
  secret = settings.wakeSecret,
  at = new Date(),
  id = `wake_${crypto.randomUUID()}`,
): Record<string, string> {
  return {
    "webhook-id": id,
    "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
    "webhook-signature": new Webhook(secret).sign(id, at, body),
  };
}

/** A wake-up as the database sends one, or with `headers` instead of its signature. */
function wake(body = BODY, headers: Record<string, string> = signed(body)) {
  return new Request("http://localhost/job-worker", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body,
  });
}

/**
 * A FakeClock whose sleeps wait for the test to move it on (`advance()`), so that a drain
 * lingers until the test lets it go on.
 */
class HeldClock extends FakeClock {
  override sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
    new Promise((resolve) => {
      this.at(this.time + ms, resolve);
      signal?.addEventListener("abort", () => resolve(), { once: true });
    });
}

/** Lets the drain's pending promises run (no time passes on the test's clock). */
async function settle(): Promise<void> {
  for (let turn = 0; turn < 20; turn++) await new Promise((resolve) => setTimeout(resolve, 0));
}

function setUp(
  overrides: Partial<Settings> = {},
  metrics: () => Promise<MetricSample[]> = () => Promise.resolve([]),
  clock: FakeClock = new FakeClock(),
) {
  const queue = new MemoryQueue();
  const pending: Promise<unknown>[] = [];
  const summaries: DrainSummary[] = [];
  const logged: LogEvent[] = [];
  const handle = createWakeHandler({
    settings: { ...settings, ...overrides },
    queue,
    handlers,
    waitUntil: (work) => pending.push(work),
    onDrained: (summary) => summaries.push(summary),
    onUnload: () => {},
    log: (event) => logged.push(event),
    metrics,
    clock,
  });
  return { queue, pending, summaries, logged, handle };
}

function scrape(authorization: string | null, path = "/job-worker/metrics") {
  const headers = new Headers();
  if (authorization !== null) headers.set("Authorization", authorization);
  return new Request(`http://localhost${path}`, { headers });
}

Deno.test("a signed wake-up is answered 202 and the jobs run after", async () => {
  const { queue, pending, summaries, handle } = setUp();
  queue.add("ok");
  queue.add("ok");

  const response = await handle(wake());

  assert.equal(response.status, 202);
  const body = await response.json();
  assert.equal(body.accepted, true);
  assert.equal(body.joined, false);
  assert.deepEqual(body.queues, ["default"]);
  assert.equal(pending.length, 1, "the work is handed to waitUntil");
  await Promise.all(pending);
  assert.deepEqual(queue.byStatus("done"), [1, 2]);
  assert.equal(summaries[0].completed, 2);
});

Deno.test("a wake-up while a drain lingers joins it, whatever its queues", async () => {
  const clock = new HeldClock();
  const { queue, pending, summaries, handle } = setUp(
    { lingerMs: 500, lingerPollMs: 10 },
    undefined,
    clock,
  );
  queue.add("ok");
  const first = await (await handle(wake())).json();
  await settle();
  assert.deepEqual(queue.byStatus("done"), [1], "the first job is done; the drain lingers");

  queue.add("ok");
  const second = await handle(wake());
  const other = await handle(
    wake('{"queues":["default","emails"]}'),
  );

  assert.equal(second.status, 202);
  assert.equal(first.joined, false);
  assert.equal((await second.json()).joined, true);
  assert.equal((await other.json()).joined, true, "the drain takes on the other queue");
  assert.equal(pending.length, 3, "each wake-up hands its work to waitUntil");
  assert.deepEqual(pending.slice(1), [pending[0], pending[0]], "the drain they joined");
  let ended = false;
  pending[0].then(() => ended = true);
  for (let polls = 0; !ended && polls < 100; polls++) {
    clock.advance(10);
    await settle();
  }
  assert.ok(ended, "the drain ends once its linger window passes with nothing found");
  assert.deepEqual(queue.byStatus("done"), [1, 2]);
  assert.deepEqual(summaries.map((summary) => summary.wakeUps), [3]);
  assert.ok(queue.claims.some((claim) => claim.queue === "emails"));
});

Deno.test("a wake-up the database did not sign is refused, and claims nothing", async () => {
  const { queue, pending, handle, logged } = setUp();
  queue.add("ok");
  const minutes = (n: number) => new Date(Date.now() + n * 60_000);
  const real = signed(BODY);
  const refused: [string, Request, number][] = [
    ["unsigned", wake(BODY, {}), 401],
    [
      "the secret as a bearer token",
      wake(BODY, { Authorization: `Bearer ${settings.wakeSecret}` }),
      401,
    ],
    ["the service key", wake(BODY, { Authorization: "Bearer service-key" }), 401],
    ["another key", wake(BODY, signed(BODY, "whsec_b3RoZXIta2V5LW9mLXRoZS10ZXN0cw==")), 403],
    ["another body", wake('{"queues":["elsewhere"]}', real), 403],
    ["stale", wake(BODY, signed(BODY, settings.wakeSecret, minutes(-6))), 403],
    ["ahead", wake(BODY, signed(BODY, settings.wakeSecret, minutes(6))), 403],
  ];
  for (const [name, request, status] of refused) {
    const response = await handle(request);
    assert.equal(response.status, status, name);
    assert.match((await response.json()).error, /PGQUEUE_WAKE_SECRET/);
  }
  assert.equal(pending.length, 0);
  assert.equal(queue.calls.length, 0);
  // logged once (a minute at most), with what to check
  const lines = logged.filter((line) => line.event === "wake.refused");
  assert.equal(lines.length, 1);
  assert.match(String(lines[0].check), /PGQUEUE_WAKE_SECRET.*health\(\).*clock/);
});

Deno.test("a wake-up is taken once: its replay is refused", async () => {
  const { handle } = setUp();
  const headers = signed(BODY);
  assert.equal((await handle(wake(BODY, headers))).status, 202);
  assert.equal((await handle(wake(BODY, headers))).status, 403);
  assert.equal((await handle(wake())).status, 202, "a new id");
});

Deno.test("only POST wakes the worker", async () => {
  const { handle } = setUp();
  const response = await handle(new Request("http://localhost/job-worker"));
  assert.equal(response.status, 405);
  assert.equal(response.headers.get("Allow"), "POST");
  await response.body?.cancel();
});

Deno.test("GET /metrics with the service key answers the metrics as Prometheus text", async () => {
  const { handle } = setUp({}, () =>
    Promise.resolve([
      { metric: "pgqueue_jobs_queued", labels: { queue: "default", kind: "ok" }, value: 2 },
    ]));
  const response = await handle(scrape("Bearer service-key"));
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("Content-Type"), PROMETHEUS_CONTENT_TYPE);
  assert.match(await response.text(), /^pgqueue_jobs_queued\{queue="default",kind="ok"\} 2$/m);
});

Deno.test("GET /metrics without the service key is refused with 401", async () => {
  let read = 0;
  const { handle } = setUp({}, () => {
    read++;
    return Promise.resolve([]);
  });
  for (const authorization of [null, "Bearer wrong-key", "service-key"]) {
    const response = await handle(scrape(authorization));
    assert.equal(response.status, 401);
    assert.equal(response.headers.get("WWW-Authenticate"), 'Bearer realm="metrics"');
    assert.match((await response.json()).error, /Authorization: Bearer <service key>/);
  }
  assert.equal(read, 0, "the metrics are not even read");
});

Deno.test("GET /metrics answers 503 when the metrics cannot be read", async () => {
  const { handle, logged } = setUp({}, () => Promise.reject(new Error("database is down")));
  const response = await handle(scrape("Bearer service-key"));
  assert.equal(response.status, 503);
  assert.match(
    (await response.json()).error,
    /Cannot read the queue's metrics: .*database is down/,
  );
  assert.deepEqual(logged.map(({ event }) => event), ["metrics.error"]);
});

Deno.test("a malformed body is answered 400", async () => {
  const { handle } = setUp();
  const response = await handle(wake('{"queues": "default"}'));
  assert.equal(response.status, 400);
  assert.match((await response.json()).error, /"queues" must be a list/);
});

Deno.test("the wake-up body names the queues; an empty one means the default queue", () => {
  assert.deepEqual(parseWake('{"reason":"sweep","queues":["a","b"]}'), {
    reason: "sweep",
    queues: ["a", "b"],
  });
  assert.deepEqual(parseWake(""), { reason: "manual", queues: ["default"] });
  assert.deepEqual(parseWake("{}"), { reason: "manual", queues: ["default"] });
  assert.throws(() => parseWake("not json"), /it is not JSON/);
  assert.throws(() => parseWake('{"queues": []}'), /must be a list of queue names/);
});

// -- one drain per isolate, within its limits ---------------------------------------------

/** A handler that holds every job until `open()`, counting the jobs in flight. */
function heldJobs() {
  let open = () => {};
  const gate = new Promise<void>((resolve) => open = resolve);
  const counts = { inFlight: 0, most: 0, ran: 0 };
  const held = defineHandler(z.object({}), async () => {
    counts.inFlight += 1;
    counts.most = Math.max(counts.most, counts.inFlight);
    await gate;
    counts.inFlight -= 1;
    counts.ran += 1;
  });
  return { held, open, counts };
}

for (const waiting of [400, 5]) {
  Deno.test(`30 wake-ups at once with ${waiting} jobs waiting are one drain, within the cap`, async () => {
    const queue = new MemoryQueue();
    for (let n = 0; n < waiting; n++) queue.add("held");
    const { held, open, counts } = heldJobs();
    const pending: Promise<unknown>[] = [];
    const summaries: DrainSummary[] = [];
    const handle = createWakeHandler({
      settings: { ...settings, batchSize: 10, maxJobsInFlight: 10 },
      queue,
      handlers: { held },
      waitUntil: (work) => pending.push(work),
      onDrained: (summary) => summaries.push(summary),
      onUnload: () => {},
      log: () => {},
    });

    const responses = await Promise.all(
      Array.from({ length: 30 }, () => handle(wake())),
    );
    assert.deepEqual(responses.map((response) => response.status), Array(30).fill(202));
    open();
    await Promise.all(pending);

    assert.equal(summaries.length, 1, "one drain");
    assert.equal(summaries[0].wakeUps, 30);
    assert.ok(counts.most <= 10, `${counts.most} jobs in flight at once`);
    assert.equal(counts.ran, waiting);
    assert.equal(queue.byStatus("done").length, waiting);
    // A claim per batch, and one that finds the queue empty (reporting the last batch).
    assert.ok(queue.calls.length <= Math.ceil(waiting / 10) + 2, `${queue.calls.length} calls`);
  });
}

Deno.test("beforeunload mid-batch releases the running jobs and sends the completions", async () => {
  const queue = new MemoryQueue();
  const quick = queue.add("ok");
  const slow = queue.add("slow");
  queue.add("ok"); // waits for a claim that never comes
  let unload: ((reason?: string) => void) | undefined;
  let slowStarted = () => {};
  const running = new Promise<void>((resolve) => slowStarted = resolve);
  const pending: Promise<unknown>[] = [];
  const summaries: DrainSummary[] = [];
  const handle = createWakeHandler({
    settings: { ...settings, batchSize: 2 },
    queue,
    handlers: {
      ...handlers,
      slow: defineHandler(
        z.object({}),
        (_payload, { signal }) =>
          new Promise((_resolve, reject) => {
            signal.addEventListener("abort", () => reject(signal.reason));
            slowStarted();
          }),
      ),
    },
    waitUntil: (work) => pending.push(work),
    onDrained: (summary) => summaries.push(summary),
    onUnload: (listener) => unload = listener,
    log: () => {},
  });
  await handle(wake());
  await running;
  assert.equal(slow.status, "running");
  assert.ok(unload, "the handler listens for beforeunload");

  const claimsBefore = queue.claims.length;
  unload("cpu"); // the runtime's beforeunload at 90% of its CPU limit
  await Promise.all(pending);

  assert.equal(queue.claims.length, claimsBefore, "no claim after beforeunload");
  assert.deepEqual([slow.status, slow.attempts, slow.lastError], ["queued", 0, null]);
  assert.equal(quick.status, "done", "its completion was sent");
  assert.deepEqual(queue.byStatus("queued"), [2, 3]);
  assert.equal(summaries[0].stoppedBy, "unload");
  assert.equal(summaries[0].unloadReason, "cpu");
  assert.deepEqual([summaries[0].released, summaries[0].completed], [1, 1]);
});

Deno.test("with a metrics token, GET /metrics takes that token and no service key", async () => {
  const token = ["metrics", "token", "of", "the", "tests"].join("-");
  const { handle } = setUp({ metricsToken: token });
  const scraped = await handle(scrape(`Bearer ${token}`));
  assert.equal(scraped.status, 200);
  await scraped.body?.cancel();
  for (
    const authorization of ["Bearer service-key", "Bearer whsec_d2FrZS1zZWNyZXQtb2YtdGhlLXRlc3Rz"]
  ) {
    const response = await handle(scrape(authorization));
    assert.equal(response.status, 401, authorization);
    assert.match(
      (await response.json()).error,
      /Bearer <metrics token>` \(PGQUEUE_METRICS_TOKEN\)/,
    );
  }
  // and the token wakes nothing
  assert.equal((await handle(wake(BODY, { Authorization: `Bearer ${token}` }))).status, 401);
});
