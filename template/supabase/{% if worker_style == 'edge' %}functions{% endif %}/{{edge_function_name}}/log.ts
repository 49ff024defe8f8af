// Machinery: the worker's log lines, one JSON object each (worker.ts, report.ts, run_job.ts and
// http.ts write them).
/** A log line: its `event` name and whatever else describes it. */
export type LogEvent = { event: string } & Record<string, unknown>;

/** One JSON line per event, which the Edge runtime's logs show as they are. */
export function logJson(event: LogEvent): void {
  console.log(JSON.stringify(event));
}
