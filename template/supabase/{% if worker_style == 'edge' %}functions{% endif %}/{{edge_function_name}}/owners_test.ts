// job.owner (owners.ts) and UserFacingError (job.ts, report.ts) in a drain.
import assert from "node:assert/strict";
import { type HandlerMap, PermanentError, UserFacingError } from "./job.ts";
import type { ClaimedJob, FailOutcome } from "./queue.ts";
import { drain, drainOptions, MemoryQueue } from "./testing.ts";

const USER = "6f1c2d3e-0000-4000-8000-000000000001";

/** A queue that keeps, as the database does, the message failUserFacing() gave each job. */
class ShownQueue extends MemoryQueue {
  shown = new Map<number, string>();

  override async failUserFacing(claimed: ClaimedJob, message: string): Promise<FailOutcome> {
    const status = await super.failUserFacing(claimed, message);
    if (status === "failed") this.shown.set(claimed.id, message);
    return status;
  }
}

function ownerRecording(seen: Map<number, string | null>): HandlerMap {
  const record = (_payload: unknown, { job }: { job: { id: number; owner: string | null } }) => {
    seen.set(job.id, job.owner);
    return Promise.resolve(null);
  };
  return { export_data: record, ok: record };
}

Deno.test("handlers see the owner of a job a user submitted, and null for others", async () => {
  const queue = new MemoryQueue();
  queue.clientKindList = ["export_data"];
  const mine = queue.add("export_data").id;
  const serviceOnes = queue.add("export_data").id;
  const other = queue.add("ok").id;
  queue.owners.set(mine, USER);
  const seen = new Map<number, string | null>();

  await drain(["default"], drainOptions(queue, { handlers: ownerRecording(seen) }));

  assert.deepEqual(
    [seen.get(mine), seen.get(serviceOnes), seen.get(other)],
    [USER, null, null],
  );
  // Only the jobs of a kind open to users were looked up.
  assert.deepEqual(queue.ownerCalls, [[mine, serviceOnes]]);
});

Deno.test("a project with no kind open to users never looks owners up", async () => {
  const queue = new MemoryQueue();
  const id = queue.add("export_data").id;
  queue.owners.set(id, USER);
  const seen = new Map<number, string | null>();

  await drain(["default"], drainOptions(queue, { handlers: ownerRecording(seen) }));

  assert.equal(seen.get(id), null);
  assert.deepEqual(queue.ownerCalls, []);
});

Deno.test("a UserFacingError fails its job for good, its message kept for the owner", async () => {
  const queue = new ShownQueue();
  const id = queue.add("export_data").id;
  const handlers: HandlerMap = {
    export_data: () => Promise.reject(new UserFacingError("your export is over 1 GB")),
  };

  await drain(["default"], drainOptions(queue, { handlers }));

  assert.deepEqual(queue.byStatus("failed"), [id]);
  const job = queue.jobs.find((job) => job.id === id)!;
  assert.equal(job.lastError, "UserFacingError: your export is over 1 GB");
  assert.deepEqual([...queue.shown], [[id, "your export is over 1 GB"]]);
});

Deno.test("a PermanentError reads like a UserFacingError in vain: its owner is shown nothing", async () => {
  const queue = new ShownQueue();
  const id = queue.add("export_data").id;
  const handlers: HandlerMap = {
    export_data: () => Promise.reject(new PermanentError("UserFacingError: token=s3cret")),
  };

  await drain(["default"], drainOptions(queue, { handlers }));

  assert.deepEqual(queue.byStatus("failed"), [id]);
  assert.deepEqual([...queue.shown], []);
});
