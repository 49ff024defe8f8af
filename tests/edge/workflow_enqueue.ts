// tests/edge: builds one of test_edge_workflows.py's workflows with the function's Workflow
// (workflow.ts) and enqueues it with its queue client, against the Data API the environment
// names; prints {step name: job id} as JSON. Arguments: the shape, and (failure) the URL whose
// answer fails its first step unless 2xx. The shape "album" runs docs/workflows.md's
// makeAlbum() (in ../_shared/album.ts).
import { type Step, Workflow } from "./workflow.ts";
import { supabaseQueue } from "./queue.ts";
import { loadSettings } from "./settings.ts";
import { STEP } from "./handlers/workflow_step.ts";
import { makeAlbum } from "../_shared/album.ts";

const queue = supabaseQueue(loadSettings());
const [shape, failUnless] = Deno.args;
if (shape === "album") {
  console.log(
    JSON.stringify({ album: await makeAlbum(queue, "beach.jpg", "summer") }),
  );
  Deno.exit(0);
}
const workflow = new Workflow();
const steps: Record<string, Step<unknown>> = {};
const step = (
  name: string,
  after: Step<unknown>[] = [],
  options: { pad?: number; failUnless?: string; run?: boolean } = {},
) =>
  steps[name] = workflow.step(STEP, {
    name,
    pad: options.pad,
    failUnless: options.failUnless,
  }, {
    after,
    ...(options.run ? { onDependencyFailure: "run" as const } : {}),
  });
if (shape === "diamond") {
  step("A");
  step("B", [steps.A]);
  step("C", [steps.A]);
  step("D", [steps.B, steps.C]);
} else if (shape === "chain") {
  for (let n = 0; n < 10; n++) {
    step(`s${n}`, n === 0 ? [] : [steps[`s${n - 1}`]]);
  }
} else if (shape === "fanin") {
  // results of 2 kB each, 2 MB in all: left out of the fan-in's payload, and fetched
  const children = Array.from(
    { length: 1000 },
    (_, n) => step(`c${n}`, [], { pad: 2000 }),
  );
  step("zip", children);
} else if (shape === "failure") {
  step("A", [], { failUnless });
  step("B", [steps.A]);
  step("C", [steps.B]);
  step("R", [steps.A], { run: true });
} else {
  throw new Error(`unknown shape ${shape}`);
}
await workflow.enqueue(queue);
console.log(
  JSON.stringify(
    Object.fromEntries(Object.entries(steps).map(([k, s]) => [k, s.id])),
  ),
);
