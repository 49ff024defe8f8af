// probe: a job kind for tests/edge, added to a copy of the rendered function (never to a
// generated project). It reports the progress it is given, holds for `holdMs`, and returns
// `result`, or a string of `text` bytes of JSON, or an array of `zeros` zeros (small as JSON,
// several times larger as jsonb).
import { z } from "zod";
import { defineHandler } from "../job.ts";

export const probe = defineHandler(
  z.object({
    progress: z.json().optional(),
    holdMs: z.number().default(0),
    result: z.json().optional(),
    text: z.number().optional(),
    zeros: z.number().optional(),
  }),
  async (
    { progress, holdMs, result, text, zeros },
    { signal, reportProgress },
  ) => {
    if (progress !== undefined && !(await reportProgress(progress))) {
      throw new Error("progress was refused: the lease was lost");
    }
    if (holdMs > 0) {
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, holdMs);
        signal.addEventListener("abort", () => clearTimeout(timer));
      });
    }
    if (text !== undefined) return "x".repeat(text - 2);
    if (zeros !== undefined) return new Array(zeros).fill(0);
    return result;
  },
);
