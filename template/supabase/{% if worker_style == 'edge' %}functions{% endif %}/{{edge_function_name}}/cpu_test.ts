// The CPU meter (cpu.ts) on the real clock: what it counts of a thread held busy.
import assert from "node:assert/strict";
import { LoopMeter } from "./cpu.ts";

/** Holds the thread for `ms`, as a synchronous loop in a handler would. */
function spin(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) { /* busy */ }
}

const tick = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

Deno.test("the meter counts the time a handler holds the thread when called", () => {
  const meter = new LoopMeter();
  const returned = meter.hold(() => {
    spin(30);
    return "the handler's promise";
  });
  assert.equal(returned, "the handler's promise");
  assert.ok(meter.busyMs() >= 30, `${meter.busyMs()} ms`);
});

Deno.test("while watching, the event loop's lag counts, and a hold is not counted twice", async () => {
  const meter = new LoopMeter();
  let told = 0;
  const stop = meter.onBusy(() => told++);
  meter.watch(true);
  try {
    // Held outside any handler's call (an await's continuation): seen as the loop's lag.
    await tick(0);
    spin(300);
    await tick(120);
    const lagged = meter.busyMs();
    assert.ok(lagged >= 150, `${lagged} ms of lag counted`);
    assert.ok(told > 0, "its listeners were told");

    // Held in a handler's call: counted once, not again as lag.
    meter.hold(() => spin(300));
    await tick(120);
    const held = meter.busyMs() - lagged;
    assert.ok(held >= 300 && held < 450, `${held} ms counted for a 300 ms hold`);
  } finally {
    meter.watch(false);
    stop();
  }
  const idle = meter.busyMs();
  await tick(120);
  assert.equal(meter.busyMs(), idle, "not watching: nothing more is counted");
});
