// Machinery: what a drain (worker.ts) takes and tells: its options, the summary of what it
// did (the drain.end log line), and the handle later wake-ups join it through.
import type { Clock } from "./clock.ts";
import type { CpuBudget } from "./cpu.ts";
import type { HandlerMap } from "./job.ts";
import type { LogEvent, LogLevel } from "./log.ts";
import type { WorkerQueue } from "./queue.ts";
import type { ReportCounts } from "./report.ts";

export interface DrainOptions {
  queue: WorkerQueue;
  handlers: HandlerMap;
  /** Recorded on each claimed job (locked_by). */
  workerId: string;
  /** The most jobs one claim takes. */
  batchSize: number;
  /** The slots: the most jobs running at once (default: batchSize). */
  maxJobsInFlight?: number;
  /** The longest lease a claim asks for (default 60 s), renewed while its jobs run. */
  leaseSeconds?: number;
  /** Stop claiming once this much time has passed since the drain started. */
  timeBudgetMs: number;
  /**
   * How long the platform lets an isolate live (wall clock), counted from `isolateStartedAt`:
   * 150 s on the free plan, 400 s on paid plans.
   */
  wallClockLimitMs: number;
  /** When the isolate started, on the clock (default: when the drain started). */
  isolateStartedAt?: number;
  /** The longest a Data API call may take (default 10 s), and never longer than time left. */
  callTimeoutMs?: number;
  /** Go on claiming for this long after the queues ran dry (default 0: stop at once). */
  lingerMs?: number;
  /** The first pause while lingering; each next one is twice as long. */
  lingerPollMs: number;
  /** The isolate's CPU budget (cpu.ts), shared by its drains; default: none counted. */
  cpu?: CpuBudget;
  clock?: Clock;
  log?: (event: LogEvent) => void;
  /** "debug" logs a line per job too (log.ts). */
  logLevel?: LogLevel;
}

/** What a drain did; the counts of its jobs' ends are ReportCounts' (report.ts). */
export interface DrainSummary extends ReportCounts {
  /** The wake-ups this drain served: the one that started it and those that joined it. */
  wakeUps: number;
  /** complete_and_claim() calls made. */
  calls: number;
  /** heartbeat_many() calls made. */
  heartbeats: number;
  claimed: number;
  /**
   * Why claiming stopped: the queues stayed empty for the whole linger window, the time
   * budget ran out, the isolate's wall-clock limit was near, its CPU time was nearly spent,
   * the runtime unloaded the function, or a call to the API failed.
   */
  stoppedBy: "empty" | "time budget" | "wall-clock limit" | "cpu budget" | "unload" | "error";
  /** The runtime's reason for unloading (beforeunload's detail.reason), when it said one. */
  unloadReason?: string;
  error?: string;
  elapsedMs: number;
  /** The CPU time the meter counted while the drain ran (cpu.ts), in ms. */
  cpuMs: number;
}

/** A drain under way, which later wake-ups join. */
export interface Drain {
  readonly queues: readonly string[];
  /**
   * Hands this drain another wake-up, for `queues` (added to those it drains): it claims
   * again at once and starts its linger window over; its deadline stays. False once it has
   * stopped claiming; then the wake-up needs a drain of its own.
   */
  join(queues: readonly string[]): boolean;
  /** The runtime is unloading the function: stop claiming, release the jobs running. */
  unload(reason?: string): void;
  readonly done: Promise<DrainSummary>;
}
