// step: a job kind for tests/edge/test_edge_workflows.py, added to a copy of the rendered
// function (never to a generated project). Logs its start and end (step.start, step.end) with
// what its dependencies ended as (job.dependencies); fails for good unless a POST to `failUnless`
// (a URL of the test's) answers 2xx; returns its name and its done dependencies' names (typed by the kind
// STEP), padded to a size on demand.
import { z } from "zod";
import { defineHandler, defineKind, PermanentError } from "../job.ts";

export const STEP = defineKind(
  "step",
  z.object({
    name: z.string(),
    failUnless: z.string().optional(),
    pad: z.number().default(0),
  }),
  z.object({ name: z.string(), after: z.array(z.string()), pad: z.string() }),
);

export const workflowStep = defineHandler(
  STEP,
  async ({ name, failUnless, pad }, { job, signal }) => {
    const line = { jobId: job.id, name, t: Date.now() };
    console.log(JSON.stringify({ event: "step.start", ...line }));
    if (failUnless !== undefined) {
      const answer = await fetch(failUnless, { method: "POST", signal });
      await answer.body?.cancel();
      if (!answer.ok) throw new PermanentError(`step ${name} failed`);
    }
    const after = job.dependencies.results(STEP).map((result) => result.name);
    const dependencies = Object.fromEntries(
      [...job.dependencies.byId.values()].map((d) => [
        String(d.id),
        { kind: d.kind, status: d.status, error: d.error },
      ]),
    );
    console.log(JSON.stringify({
      event: "step.end",
      ...line,
      t: Date.now(),
      after,
      dependencies,
      omitted: job.dependencies.resultsOmitted,
    }));
    return { name, after, pad: "x".repeat(pad) };
  },
);
