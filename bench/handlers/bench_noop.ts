// noop: a job that does nothing, for the template's benchmark (bench/run adds this file and
// its line in mod.ts). It prints when it started; the benchmark reads that from stdout.
import type { JobHandler } from "../job.ts";

export const benchNoop: JobHandler = (_payload, { job }) => {
  const at = performance.timeOrigin + performance.now();
  console.log(JSON.stringify({ event: "bench.start", id: job.id, at }));
  return Promise.resolve();
};
