// Completions the database could not be reached for (report.ts): tried again until it answers
// or the isolate is about to end, each logged as what it came to.
import assert from "node:assert/strict";
import { drain, drainOptions, FakeClock, MemoryQueue } from "./testing.ts";
import type { LogEvent } from "./log.ts";
import {
  type Attempt,
  type ClaimedJob,
  type CompleteAndClaimOptions,
  QueueError,
} from "./queue.ts";
import type { Json } from "./data_api.ts";

/** A MemoryQueue out of reach while `down` (the network, or PostgREST unable to reach the
 * database): the call that carries the first completions takes it down. */
class OutageQueue extends MemoryQueue {
  down = false;
  private wentDown = false;

  override completeAndClaim(options: CompleteAndClaimOptions): Promise<ClaimedJob[]> {
    if (options.done.length > 0 && !this.wentDown) this.down = this.wentDown = true;
    return this.down ? Promise.reject(unreachable()) : super.completeAndClaim(options);
  }

  override complete(attempt: Attempt, result: Json = null): Promise<boolean> {
    return this.down ? Promise.reject(unreachable()) : super.complete(attempt, result);
  }
}

function unreachable(): QueueError {
  return new QueueError("complete(): fetch failed", "complete()", "", "fetch failed");
}

/** Two jobs that succeed, whose completion meets an outage that ends `backAfterMs` later
 * (never: undefined), with what the drain logged. */
async function outage(backAfterMs: number | undefined, whileDown: (q: OutageQueue) => void) {
  const clock = new FakeClock();
  const queue = new OutageQueue();
  for (let n = 1; n <= 2; n++) queue.add("ok", { n });
  if (backAfterMs !== undefined) {
    clock.at(backAfterMs, () => {
      whileDown(queue);
      queue.down = false;
    });
  }
  const events: LogEvent[] = [];
  const options = drainOptions(queue, {
    clock,
    leaseSeconds: 5, // shorter than the outage
    log: (event) => events.push(event),
  });
  const summary = await drain(["default"], options);
  const logged = (event: string) => events.filter((e) => e.event === event).map((e) => e.id);
  return { queue, summary, logged, clock };
}

Deno.test("completions kept out by an outage longer than their lease land once it ends", async () => {
  const { queue, summary, logged, clock } = await outage(30_000, () => {});

  assert.ok(clock.now() >= 30_000, "tried until the database was back");
  assert.deepEqual(queue.byStatus("done"), [1, 2], "no sweep came first: the database took them");
  assert.equal(summary.completed, 2);
  assert.equal(summary.unreported, 0);
  assert.deepEqual(logged("job.done_late"), [1, 2]);
});

Deno.test("a completion whose job a sweep took back during the outage is logged refused", async () => {
  const { queue, summary, logged } = await outage(30_000, (down) => {
    for (const job of down.jobs) Object.assign(job, { status: "queued", lock_token: "swept" });
  });

  assert.deepEqual(queue.byStatus("queued"), [1, 2], "they run again");
  assert.equal(summary.completed, 0);
  assert.equal(summary.stale, 2);
  assert.deepEqual(logged("job.done_refused"), [1, 2]);
  assert.deepEqual(logged("job.done_late"), []);
});

Deno.test("completions the outage outlasts are tried until the isolate ends, then logged", async () => {
  const { queue, summary, logged, clock } = await outage(undefined, () => {});

  const { wallClockLimitMs } = drainOptions(queue);
  assert.ok(clock.now() >= wallClockLimitMs - 2_000, `gave up at ${clock.now()} ms`);
  assert.ok(clock.now() < wallClockLimitMs, "before the isolate ends");
  assert.deepEqual(queue.byStatus("running"), [1, 2], "the sweeper takes them back");
  assert.equal(summary.completed, 0);
  assert.equal(summary.unreported, 2);
  assert.deepEqual(logged("job.unreported"), [1, 2]);
});
