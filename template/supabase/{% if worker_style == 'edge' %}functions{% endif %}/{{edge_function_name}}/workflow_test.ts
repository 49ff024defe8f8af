// Workflows without a database: the jobs a Workflow hands enqueue_many(), and a dependent's
// `_dependencies` read into job.dependencies in a drain (the end to end runs are the
// template's tests).
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, defineKind, Dependencies, type HandlerMap } from "./job.ts";
import type { NewJob } from "./queue.ts";
import { type Enqueuer, Workflow } from "./workflow.ts";
import { takeDependencies } from "./dependencies.ts";
import { drain, drainOptions, MemoryQueue, runJob } from "./testing.ts";

const Image = z.object({ path: z.string(), bytes: z.number() });
const FETCH = defineKind("fetch", z.object({ url: z.string() }), Image);
const RESIZE = defineKind("resize", z.object({ width: z.number() }), Image);
const ALBUM = defineKind("album", z.object({ name: z.string() }), z.string());

class RecordingQueue implements Enqueuer {
  calls: NewJob[][] = [];
  enqueueMany(jobs: readonly NewJob[]): Promise<number[]> {
    this.calls.push([...jobs]);
    return Promise.resolve(jobs.map((_, n) => 100 + 1024 * n));
  }
}

function diamond() {
  const workflow = new Workflow({ queue: "images" });
  const photo = workflow.step(FETCH, { url: "https://example.com/a.jpg" });
  const small = workflow.step(RESIZE, { width: 64 }, { after: [photo] });
  const large = workflow.step(RESIZE, { width: 1024 }, { after: [photo], maxAttempts: 3 });
  const album = workflow.step(ALBUM, { name: "summer" }, {
    after: [small, large, 7],
    onDependencyFailure: "run",
  });
  return { workflow, steps: [photo, small, large, album] };
}

Deno.test("a diamond is one enqueue_many list, with indexes and ids", () => {
  assert.deepEqual(diamond().workflow.jobs(), [
    { kind: "fetch", payload: { url: "https://example.com/a.jpg" }, queue: "images" },
    { kind: "resize", payload: { width: 64 }, queue: "images", depends_on_index: [0] },
    {
      kind: "resize",
      payload: { width: 1024 },
      queue: "images",
      max_attempts: 3,
      depends_on_index: [0],
    },
    {
      kind: "album",
      payload: { name: "summer" },
      queue: "images",
      depends_on: [7],
      depends_on_index: [1, 2],
      on_dependency_failure: "run",
    },
  ]);
});

Deno.test("enqueue is one call and gives each step its id", async () => {
  const { workflow, steps } = diamond();
  const queue = new RecordingQueue();
  assert.deepEqual(await workflow.enqueue(queue), [100, 1124, 2148, 3172]);
  assert.deepEqual(steps.map((step) => step.id), [100, 1124, 2148, 3172]);
  assert.equal(queue.calls.length, 1);
  assert.deepEqual(queue.calls[0][3].dependsOnIndex, [1, 2]);
  await assert.rejects(workflow.enqueue(queue), /enqueued already/);
  const later = new Workflow();
  later.step("notify", { to: "ada" }, { after: [steps[3]] });
  assert.deepEqual(later.jobs(), [{ kind: "notify", payload: { to: "ada" }, depends_on: [3172] }]);
});

Deno.test("wrong steps are refused with what to do", () => {
  const workflow = new Workflow();
  // @ts-expect-error: a resize takes a width
  assert.throws(() => workflow.step(RESIZE, { url: "x" }), /invalid payload/);
  assert.throws(() => workflow.step("x", { _dependencies: {} }), /the queue sets it/);
  const pending = new Workflow().step("a");
  assert.throws(() => workflow.step("b", {}, { after: [pending] }), /enqueue that workflow first/);
  assert.throws(() => pending.id, /enqueue its workflow/);
  assert.throws(() => workflow.enqueued([]), /has no steps/);
  workflow.step("c");
  assert.throws(() => workflow.enqueued([1, 2]), /2 job ids for a workflow of 1 steps/);
});

Deno.test("dependencies are taken out of the payload, by id and by kind", () => {
  const { payload, dependencies } = takeDependencies({
    name: "summer",
    _dependencies: {
      "1124": { kind: "resize", status: "done", result: { path: "s", bytes: 9 } },
      "2148": { kind: "resize", status: "failed", result: null, error: "boom" },
      "100": { kind: "fetch", status: "done", result: { path: "a", bytes: 90 } },
    },
  });
  assert.deepEqual(payload, { name: "summer" });
  assert.deepEqual([...dependencies.byId.keys()], [100, 1124, 2148]);
  assert.equal(dependencies.get(2148)?.error, "boom");
  assert.deepEqual(dependencies.ofKind(RESIZE).map((d) => d.id), [1124, 2148]);
  assert.deepEqual(Object.keys(dependencies.byKind), ["fetch", "resize"]);
  assert.deepEqual(dependencies.results(RESIZE), [{ path: "s", bytes: 9 }]);
  assert.deepEqual(dependencies.result(FETCH), { path: "a", bytes: 90 });
  assert.deepEqual(dependencies.failed.map((d) => d.id), [2148]);
  assert.throws(() => dependencies.result(ALBUM), /0 done dependencies of kind "album"/);
  assert.throws(() => takeDependencies({ _dependencies: [1] }), /keyed by job id/);
  assert.throws(
    () => takeDependencies({ _dependencies: { x: { kind: "a", status: "done" } } }),
    /\["x"\] is not a job id/,
  );
  assert.equal(takeDependencies({ a: 1 }).dependencies.size, 0);
});

Deno.test("a drain hands the handler its dependencies, fetched when the queue left them out", async () => {
  const seen = new Map<number, { payload: unknown; dependencies: Dependencies }>();
  const handlers: HandlerMap = {
    album: defineHandler(z.object({ name: z.string() }).strict(), (payload, { job }) => {
      seen.set(job.id, { payload, dependencies: job.dependencies });
      return job.dependencies.results(RESIZE).map((image) => image.path).join(",");
    }),
  };
  const queue = new MemoryQueue();
  const inline = queue.add("album", {
    name: "a",
    _dependencies: { "5": { kind: "resize", status: "done", result: { path: "p", bytes: 1 } } },
  });
  const omitted = queue.add("album", {
    name: "b",
    _dependencies: { "6": { kind: "resize", status: "done", results_omitted: true } },
  });
  queue.dependencyRows.set(omitted.id, [
    { id: 6, kind: "resize", status: "done", result: { path: "q", bytes: 2 }, error: null },
  ]);
  await drain(["default"], drainOptions(queue, { handlers }));
  assert.deepEqual(seen.get(inline.id)?.payload, { name: "a" });
  assert.equal(seen.get(omitted.id)?.dependencies.resultsOmitted, true);
  assert.deepEqual(queue.jobs.map((job) => [job.status, job.result]), [["done", "p"], [
    "done",
    "q",
  ]]);
});

Deno.test("runJob hands a handler the dependencies a test gives it", async () => {
  const album = defineHandler(
    ALBUM.payload,
    ({ name }, { job }) => job.dependencies.results(RESIZE).map((i) => `${name}: ${i.path}`),
  );
  const dependencies = new Dependencies([
    { id: 3, kind: "resize", status: "done", result: { path: "s", bytes: 1 }, error: null },
  ]);
  const ran = await runJob("album", { name: "summer" }, {
    handlers: { album },
    job: { dependencies },
  });
  assert.deepEqual(ran.result, ["summer: s"]);
});
