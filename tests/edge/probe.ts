// probe: a job kind for tests/edge, added to a copy of the rendered function (never to a
// generated project). It reports the progress it is given, holds the thread for `spinMs` (a
// synchronous loop: CPU time, as the Edge runtime counts it), holds for `holdMs`, and returns
// `result`, or a string of `text` bytes of JSON, or an array of `zeros` zeros (small as JSON,
// several times larger as jsonb). Each one that holds logs how many probes were in flight as it
// started (probe.start).
import { z } from "zod";
import { defineHandler } from "../job.ts";

let inFlight = 0;

export const probe = defineHandler(
  z.object({
    progress: z.json().optional(),
    spinMs: z.number().default(0),
    holdMs: z.number().default(0),
    result: z.json().optional(),
    text: z.number().optional(),
    zeros: z.number().optional(),
  }),
  async (
    { progress, spinMs, holdMs, result, text, zeros },
    { signal, reportProgress },
  ) => {
    const spinUntil = performance.now() + spinMs;
    while (performance.now() < spinUntil) { /* busy */ }
    if (progress !== undefined && !(await reportProgress(progress))) {
      throw new Error("progress was refused: the lease was lost");
    }
    if (holdMs > 0) {
      inFlight += 1;
      console.log(JSON.stringify({ event: "probe.start", inFlight }));
      await new Promise((resolve) => {
        const timer = setTimeout(() => {
          inFlight -= 1;
          resolve(undefined);
        }, holdMs);
        signal.addEventListener("abort", () => {
          clearTimeout(timer);
          inFlight -= 1;
        });
      });
    }
    if (text !== undefined) return "x".repeat(text - 2);
    if (zeros !== undefined) return new Array(zeros).fill(0);
    return result;
  },
);
