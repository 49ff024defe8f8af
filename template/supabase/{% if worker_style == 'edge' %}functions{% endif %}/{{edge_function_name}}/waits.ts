// Machinery: a drain's waits (worker.ts). Once the queues ran dry, it lingers: it claims again
// after PGQUEUE_LINGER_POLL_MS, then after twice as long each time, until PGQUEUE_LINGER_MS
// pass with nothing found (an idle drain makes a few calls, then none). While its slots are
// full, it waits for a job to end; a wake-up that joins, or a stop, cuts either wait short.
import type { Clock } from "./clock.ts";
import { aborted } from "./leases.ts";

export class Waits {
  // When the queues were last found dry, while the drain lingers; undefined while it works.
  private drySince: number | undefined;
  private nextPauseMs: number;
  private interruptPause: AbortController | undefined;
  // Wakes the drain while it waits for a slot: a job ended, a wake-up joined, a stop.
  private waiter: (() => void) | undefined;
  private kicked = false;

  constructor(
    private readonly clock: Clock,
    private readonly firstPauseMs: number,
    private readonly lingerMs: number,
  ) {
    this.nextPauseMs = firstPauseMs;
  }

  /** Jobs were found, or a wake-up joined: the linger window and its pauses start over. */
  restart(): void {
    this.drySince = undefined;
    this.nextPauseMs = this.firstPauseMs;
  }

  /** The queues ran dry: the next pause of the linger window, or 0 once it has passed. */
  nextPause(): number {
    this.drySince ??= this.clock.now();
    const lingerLeft = this.drySince + this.lingerMs - this.clock.now();
    return lingerLeft <= 0 ? 0 : Math.min(this.nextPauseMs, lingerLeft);
  }

  /** Pauses `ms`, or until a wake-up or a stop cuts it short; the next pause is twice it. */
  async pause(ms: number): Promise<void> {
    // (Before the pause: a wake-up that joins during it starts the pauses over.)
    this.nextPauseMs *= 2;
    this.interruptPause = new AbortController();
    await this.clock.sleep(ms, this.interruptPause.signal);
    this.interruptPause = undefined;
  }

  /** Waits until kick() (a job ended, a wake-up joined, a stop), or `until` comes. */
  next(until?: number): Promise<void> {
    if (this.kicked) {
      this.kicked = false;
      return Promise.resolve();
    }
    const woken = new Promise<void>((resolve) => this.waiter = resolve);
    if (until === undefined) return woken;
    const timer = this.clock.timeout(until - this.clock.now());
    return Promise.race([woken, aborted(timer)]).then(() => {
      this.waiter = undefined;
    });
  }

  /** Ends the wait under way (or the next one, at once), and any pause. */
  kick(): void {
    this.interruptPause?.abort();
    const waiter = this.waiter;
    this.waiter = undefined;
    if (waiter === undefined) this.kicked = true;
    else waiter();
  }
}
