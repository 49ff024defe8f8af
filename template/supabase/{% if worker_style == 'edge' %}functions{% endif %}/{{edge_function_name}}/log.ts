// Machinery: the worker's log lines, one JSON object each (worker.ts, report.ts, run_job.ts and
// http.ts write them). The Edge runtime keeps at most 100 log events per 10 s of a function and
// drops the rest, so at the default level ("info") a drain writes one line when it ends, with
// its totals, and one per failure; a line per job ("debug") is for a trickle of jobs.
/** A log line: its `event` name and whatever else describes it. */
export type LogEvent = { event: string } & Record<string, unknown>;

/** "info": a line per drain and per failure; "debug": a line per job as well. */
export type LogLevel = "info" | "debug";

/** One JSON line per event, which the Edge runtime's logs show as they are. */
export function logJson(event: LogEvent): void {
  console.log(JSON.stringify(event));
}

/** What writes the per-job lines: `log` at "debug", nothing at "info". */
export function jobLog(
  log: (event: LogEvent) => void,
  level: LogLevel = "info",
): (event: LogEvent) => void {
  return level === "debug" ? log : () => {};
}
