// Machinery: a drain's pool of slots (worker.ts), and which claim fills them next. Each woken
// queue has a lane for its light kinds (a claim takes as many as slots are free) and, when
// some kinds are declared CPU-heavy, one for those (a claim takes one, into an empty pool: it
// runs alone). Lanes take turns; a lane whose claim came back short rests until one of its
// jobs ends, the linger's next poll, or a wake-up.
import type { Clock } from "./clock.ts";
import type { CpuBudget } from "./cpu.ts";
import { cut, type LeasedJob } from "./leases.ts";
import type { CutAs } from "./report.ts";

/**
 * While jobs run, a claim waits until half the slots are free, or this long after it could
 * have filled one: a call costs the isolate about 1 ms of CPU time, so jobs that end together
 * are refilled by one call, not one each, and a slot is never idle longer than this.
 */
const REFILL_WAIT_MS = 20;

/** Claims of one queue: of its light kinds, or of its heavy ones. */
export interface Lane {
  queue: string;
  kinds: string[];
  heavy: boolean;
  /** Worth a claim: its last one was full, or one of its jobs ended since. */
  active: boolean;
}

/** A job running in a slot, and the lane it was claimed for. */
export interface Slot extends LeasedJob {
  lane: Lane;
}

export class Pool {
  readonly running = new Map<number, Slot>();
  readonly lanes: Lane[] = [];
  private turn = 0;
  // Since when a free slot waits for more to free up before a claim fills them.
  private refillSince: number | undefined;

  constructor(
    private readonly slots: number,
    private readonly batchSize: number,
    private readonly cpu: CpuBudget,
    private readonly clock: Clock,
  ) {}

  /** Adds the lanes of `queue` for `kinds`, light and heavy apart. */
  addQueue(queue: string, kinds: readonly string[]): void {
    const { light, heavy } = this.cpu.split(kinds);
    if (light.length > 0) this.lanes.push({ queue, kinds: light, heavy: false, active: true });
    if (heavy.length > 0) this.lanes.push({ queue, kinds: heavy, heavy: true, active: true });
  }

  /** Every lane is worth a claim again (the linger's next poll, or a wake-up). */
  wakeLanes(): void {
    for (const lane of this.lanes) lane.active = true;
  }

  /**
   * The next lane, in turn, that can claim now; undefined when none can. A heavy lane claims
   * only into an empty pool: when its turn comes, the light lanes wait until the pool empties.
   */
  nextLane(): Lane | undefined {
    for (let i = 0; i < this.lanes.length; i++) {
      const index = (this.turn + i) % this.lanes.length;
      const lane = this.lanes[index];
      if (!lane.active) continue;
      if (lane.heavy && !this.cpu.canStartHeavy()) {
        lane.active = false;
        continue;
      }
      if (lane.heavy ? this.running.size > 0 : this.freeSlots() === 0) return undefined;
      this.turn = (index + 1) % this.lanes.length;
      return lane;
    }
    return undefined;
  }

  /** How many jobs a claim for `lane` takes: one heavy, or as many light as slots are free. */
  wanted(lane: Lane): number {
    return lane.heavy ? 1 : Math.min(this.batchSize, this.freeSlots());
  }

  /**
   * When to claim for `lane`: now (undefined) into an empty pool, for a heavy lane, once half
   * the slots are free, or once a free slot has waited REFILL_WAIT_MS for others; else the time
   * to claim at, unless a job ends first.
   */
  refillAt(lane: Lane): number | undefined {
    const halfTheSlots = Math.ceil(Math.min(this.slots, this.batchSize) / 2);
    if (lane.heavy || this.running.size === 0 || this.freeSlots() >= halfTheSlots) {
      this.refillSince = undefined;
      return undefined;
    }
    this.refillSince ??= this.clock.now();
    const at = this.refillSince + REFILL_WAIT_MS;
    if (this.clock.now() < at) return at;
    this.refillSince = undefined;
    return undefined;
  }

  /** Stops every job running; `as` says what becomes of them. */
  cutAll(reason: unknown, as: CutAs): void {
    for (const slot of this.running.values()) cut(slot, reason, as);
  }

  /** Free slots; none while a heavy job runs (it runs alone). */
  private freeSlots(): number {
    for (const slot of this.running.values()) if (slot.lane.heavy) return 0;
    return this.slots - this.running.size;
  }
}
