// Machinery: job.owner, who submitted each claimed job from the app. The claim does not return
// owners, so the hot path pays nothing for them: each drain reads the kinds open to signed-in
// users (`client_kinds`) as it starts, next to its check-in, and after a claim whose batch has
// jobs of those kinds reads their owners in one call (`job_owners(ids)`). A project that opens
// no kind makes no such call. A kind opened while a drain runs is known to the next drain (its
// jobs claimed before then run with owner null, like jobs the service enqueued); the same
// goes for a failed read, which is logged.
import type { ClaimedJob, WorkerQueue } from "./queue.ts";
import type { LogEvent } from "./log.ts";
import { describe } from "./run_job.ts";

export class JobOwners {
  private readonly kinds: Promise<Set<string>>;

  constructor(
    private readonly queue: WorkerQueue,
    signal: AbortSignal,
    private readonly log: (event: LogEvent) => void,
  ) {
    this.kinds = queue.clientKinds(signal).then(
      (kinds) => new Set(kinds),
      (error) => {
        log({ event: "queue.error", call: "client_kinds", error: describe(error) });
        return new Set<string>();
      },
    );
  }

  /** Sets each job's owner (null: none), with one call when some are of a client kind. */
  async assign(jobs: ClaimedJob[], signal: AbortSignal): Promise<void> {
    const kinds = await this.kinds;
    const ids = jobs.filter((job) => kinds.has(job.kind)).map((job) => job.id);
    let owners = new Map<number, string>();
    if (ids.length > 0) {
      try {
        owners = await this.queue.jobOwners(ids, signal);
      } catch (error) {
        this.log({ event: "queue.error", call: "job_owners", error: describe(error) });
      }
    }
    for (const job of jobs) job.owner = owners.get(job.id) ?? null;
  }
}
