// Test helpers (used by the *_test.ts files only, through testing.ts): a clock that tests move,
// and a CPU meter that handlers spend on.
import type { CpuMeter } from "./cpu.ts";

/**
 * A clock for the drain (clock.ts's Clock): sleeping moves it on at once, a timeout's signal
 * aborts when the clock passes its time, and so does what a test scheduled with `at()`.
 */
export class FakeClock {
  time = 0;
  private scheduled: { at: number; run: () => void }[] = [];

  now = (): number => this.time;

  sleep = (ms: number): Promise<void> => {
    this.advance(ms);
    return Promise.resolve();
  };

  timeout = (ms: number): AbortSignal => {
    const controller = new AbortController();
    const abort = () =>
      controller.abort(new DOMException(`timed out after ${ms} ms`, "TimeoutError"));
    if (ms <= 0) abort();
    else this.at(this.time + ms, abort);
    return controller.signal;
  };

  advance(ms: number): void {
    this.time += ms;
    const due = this.scheduled.filter((item) => item.at <= this.time);
    this.scheduled = this.scheduled.filter((item) => item.at > this.time);
    for (const item of due) item.run();
  }

  at(time: number, run: () => void): void {
    this.scheduled.push({ at: time, run });
  }
}

/**
 * A CPU meter for the drain (cpu.ts's CpuMeter): handlers spend on it (`spend(ms)`), as a
 * synchronous loop would hold the isolate's thread.
 */
export class FakeCpuMeter implements CpuMeter {
  busy = 0;
  watching = false;
  private readonly listeners = new Set<() => void>();

  busyMs = (): number => this.busy;
  hold = <T>(run: () => T): T => run();
  charge = (ms: number): void => {
    this.busy += ms;
  };
  watch = (on: boolean): void => {
    this.watching = on;
  };
  onBusy = (listener: () => void): () => void => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  spend(ms: number): void {
    this.busy += ms;
    for (const listener of this.listeners) listener();
  }
}
