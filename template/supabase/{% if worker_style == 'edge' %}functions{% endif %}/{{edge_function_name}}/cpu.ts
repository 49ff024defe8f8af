// Machinery: the isolate's CPU time as a budget (worker.ts spends it). The Edge runtime adds up
// the CPU time an isolate uses over its whole life, every request and drain together: at the
// soft limit it stops routing requests to it, at the hard limit it ends it at once, with no
// `beforeunload` and no time to report anything (README.md, "The runtime's limits"). A
// function cannot read that count (the runtime exposes none to user code), so the meter here
// counts what it can see: the time handlers hold the thread when called, the event loop's lag
// (how late a timer fires: something held the thread meanwhile) while jobs run, and an estimate
// for each Data API call (its HTTP and JSON, about 1 ms). It still sees less than the runtime
// counts (short holds between two samples, garbage collection), which is why the drain acts
// well before each limit.

/** Counts the time the isolate's thread is busy. */
export interface CpuMeter {
  /** Milliseconds counted busy since the isolate started (this meter was made). */
  busyMs(): number;
  /** Runs `run` (a handler's call, up to its first await) and counts the time it holds. */
  hold<T>(run: () => T): T;
  /** Watches the event loop's lag while `on` (the drain has jobs running). */
  watch(on: boolean): void;
  /** Counts `ms` the meter cannot see (a Data API call's). */
  charge(ms: number): void;
  /** Calls `listener` whenever the count may have grown; returns what stops that. */
  onBusy(listener: () => void): () => void;
}

/**
 * How often the lag is sampled while jobs run. A sample costs the isolate some 30 us (0.3 ms
 * of CPU time a second); it sees the holds longer than this in full, shorter ones in part.
 */
const LAG_SAMPLE_MS = 100;
/** The CPU time of one Data API call (HTTP, JSON) to the runtime: measured about 1 ms. */
export const CALL_CPU_MS = 1;

/** The meter of this isolate: handlers' holds, and the event loop's lag while jobs run. */
export class LoopMeter implements CpuMeter {
  private busy = 0;
  // Held during the current lag sample, so the lag it causes is not counted twice.
  private heldInSample = 0;
  private timer: ReturnType<typeof setInterval> | undefined;
  private readonly listeners = new Set<() => void>();

  busyMs(): number {
    return this.busy;
  }

  hold<T>(run: () => T): T {
    const started = performance.now();
    try {
      return run();
    } finally {
      const held = performance.now() - started;
      this.busy += held;
      this.heldInSample += held;
    }
  }

  charge(ms: number): void {
    this.busy += ms;
  }

  watch(on: boolean): void {
    if (on && this.timer === undefined) {
      let expected = performance.now() + LAG_SAMPLE_MS;
      const timer = setInterval(() => {
        const now = performance.now();
        const lag = Math.max(now - expected - this.heldInSample, 0);
        this.heldInSample = 0;
        expected = now + LAG_SAMPLE_MS;
        this.busy += lag;
        for (const listener of this.listeners) listener();
      }, LAG_SAMPLE_MS);
      // The sampling never keeps a process alive by itself (plain `deno run`).
      Deno.unrefTimer(timer);
      this.timer = timer;
    } else if (!on && this.timer !== undefined) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  onBusy(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}

/** The runtime's CPU limits for an isolate, and which job kinds spend much of it. */
export interface CpuLimits {
  /** The runtime stops routing requests to the isolate past this (1 s by default). */
  softLimitMs: number;
  /** The runtime ends the isolate at once past this (2 s by default). */
  hardLimitMs: number;
  /** Kinds whose jobs run alone, each one's CPU counted as its own. */
  heavyKinds: readonly string[];
  /** The most CPU-heavy jobs one isolate runs over its life. */
  heavyPerIsolate: number;
}

/** The share of the soft limit after which a drain claims no more. */
const CLAIM_SHARE = 0.9;
/**
 * The share of the hard limit at which a drain hands back what it holds: below the runtime's
 * `beforeunload` (at 90% of it), far enough below the kill to leave CPU for the release calls.
 */
const HAND_BACK_SHARE = 0.75;

/** The isolate's CPU budget: one per isolate, shared by its drains one after another. */
export class CpuBudget {
  readonly meter: CpuMeter;
  readonly limits: CpuLimits;
  private readonly heavy: ReadonlySet<string>;
  private heavyStarted = 0;
  // The most CPU one heavy job has taken: a drain starts another only if that much is left.
  private heaviestMs = 0;

  constructor(meter: CpuMeter, limits: CpuLimits) {
    this.meter = meter;
    this.limits = limits;
    this.heavy = new Set(limits.heavyKinds);
  }

  isHeavy(kind: string): boolean {
    return this.heavy.has(kind);
  }

  /** The kinds of `kinds` that are CPU-heavy, and the others. */
  split(kinds: readonly string[]): { light: string[]; heavy: string[] } {
    return {
      light: kinds.filter((kind) => !this.heavy.has(kind)),
      heavy: kinds.filter((kind) => this.heavy.has(kind)),
    };
  }

  /** Whether a drain may claim: busy time not yet near the soft limit. */
  canClaim(): boolean {
    return this.meter.busyMs() < this.limits.softLimitMs * CLAIM_SHARE;
  }

  /** Whether a heavy job may start: one left to this isolate, and CPU for one more. */
  canStartHeavy(): boolean {
    return this.heavyStarted < this.limits.heavyPerIsolate && this.canClaim() &&
      this.meter.busyMs() + this.heaviestMs < this.handBackMs();
  }

  /** Whether the drain must hand back what it holds: the hard limit is near. */
  mustHandBack(): boolean {
    return this.meter.busyMs() >= this.handBackMs();
  }

  /** A heavy job starts; `ended(cpuMs)` says what it took. */
  startHeavy(): (cpuMs: number) => void {
    this.heavyStarted += 1;
    return (cpuMs) => this.heaviestMs = Math.max(this.heaviestMs, cpuMs);
  }

  private handBackMs(): number {
    return this.limits.hardLimitMs * HAND_BACK_SHARE;
  }
}

/** A budget without limits, on a meter that counts nothing (a drain given no budget). */
export function unlimitedBudget(): CpuBudget {
  const uncounted: CpuMeter = {
    busyMs: () => 0,
    hold: (run) => run(),
    charge: () => {},
    watch: () => {},
    onBusy: () => () => {},
  };
  return new CpuBudget(uncounted, {
    softLimitMs: Infinity,
    hardLimitMs: Infinity,
    heavyKinds: [],
    heavyPerIsolate: 0,
  });
}

/** `queue` with every call it makes charged to `meter` (CALL_CPU_MS each). */
export function charged<Queue extends object>(queue: Queue, meter: CpuMeter): Queue {
  return new Proxy(queue, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        meter.charge(CALL_CPU_MS);
        return value.apply(target, args);
      };
    },
  });
}
