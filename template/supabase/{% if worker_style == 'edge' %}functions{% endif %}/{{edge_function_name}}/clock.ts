// Machinery: all of a drain's timing (worker.ts) goes through a Clock, so that its tests can
// run on a fake one (testing.ts's FakeClock) and a linger of seconds passes at once.
/** All the drain's timing: the runtime's by default (systemClock), a fake one in tests. */
export interface Clock {
  /** Milliseconds on a monotonic clock (systemClock: since the isolate started). */
  now(): number;
  /** Waits `ms`, or less if `signal` aborts first. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
  /** A signal that aborts with a TimeoutError `ms` from now. */
  timeout(ms: number): AbortSignal;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  sleep: abortableSleep,
  timeout: (ms) => AbortSignal.timeout(Math.max(Math.round(ms), 0)),
};

function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", cut);
      resolve();
    }, ms);
    const cut = () => {
      clearTimeout(timer);
      resolve();
    };
    signal?.addEventListener("abort", cut, { once: true });
  });
}
