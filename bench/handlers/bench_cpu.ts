// cpu: a job that holds the thread for payload.cpuMs milliseconds of work, for the template's
// benchmark (bench/run adds this file and its line in mod.ts).
import type { JobHandler } from "../job.ts";

export const benchCpu: JobHandler = (payload) => {
  const ms = Number((payload as { cpuMs?: number }).cpuMs ?? 1);
  const until = performance.now() + ms;
  let spins = 0;
  while (performance.now() < until) spins++;
  return Promise.resolve(spins > 0 ? undefined : undefined);
};
