// Machinery: the queue's metrics (the rows of the SQL metrics() function) in Prometheus' text
// exposition format 0.0.4, for GET /metrics (http.ts).
import type { MetricSample } from "./queue.ts";

export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

/** What each metric means (docs/observability.md in the template says more). */
const HELP: Record<string, string> = {
  pgqueue_jobs_queued: "Jobs in the queue, due now or later.",
  pgqueue_jobs_runnable: "Queued jobs that are due now.",
  pgqueue_jobs_running: "Jobs a worker holds under a lease.",
  pgqueue_jobs_retrying: "Queued jobs that already failed an attempt.",
  pgqueue_jobs_waiting:
    "Jobs waiting for other jobs to finish (their depends_on): not claimable until then.",
  pgqueue_oldest_runnable_age_seconds:
    "How long the queue's longest-waiting runnable job has been due (0: none is).",
  pgqueue_expired_leases: "Running jobs whose lease expired; the next sweep rescues them.",
  pgqueue_dead_letters: "Dead-lettered jobs kept in the history.",
  pgqueue_jobs_finished_5m: "Jobs that finished in the last 5 minutes, by status.",
  pgqueue_queue_paused: "1 while the queue is paused, else 0.",
  pgqueue_workers_alive:
    "Workers seen for the queue in the last 10 minutes: an Edge Function worker checks in " +
    "each time it is woken and counts until 10 minutes after; a Python worker checks in " +
    "every minute and checks out when it stops.",
  pgqueue_lease_rescues_total: "Expired leases the sweeper put back in the queue.",
  pgqueue_lease_dead_letters_total:
    "Expired leases the sweeper dead-lettered because the job had no attempts left.",
};

/**
 * The samples as Prometheus text: per metric, `# HELP` and `# TYPE` (names ending in _total
 * are counters, the others gauges), then one line per sample. Samples of one metric must be
 * next to each other, as metrics() returns them.
 */
export function formatPrometheus(samples: readonly MetricSample[]): string {
  const lines: string[] = [];
  let current = "";
  for (const { metric, labels, value } of samples) {
    const name = metricName(metric);
    if (name !== current) {
      current = name;
      const help = HELP[name] ?? `${name}, from the queue's metrics() function.`;
      lines.push(`# HELP ${name} ${escapeHelp(help)}`);
      lines.push(`# TYPE ${name} ${name.endsWith("_total") ? "counter" : "gauge"}`);
    }
    const pairs = Object.entries(labels ?? {}).map(
      ([label, labelValue]) => `${labelName(label)}="${escapeLabelValue(String(labelValue))}"`,
    );
    lines.push(`${name}${pairs.length ? `{${pairs.join(",")}}` : ""} ${formatValue(value)}`);
  }
  return lines.length ? `${lines.join("\n")}\n` : "";
}

/** In a label value: backslash, double quote and line feed are escaped. */
export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** In HELP text: backslash and line feed are escaped. */
function escapeHelp(text: string): string {
  return text.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

/** Prometheus' spelling of a float: NaN, +Inf and -Inf as such, other numbers as JSON. */
function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

// Names metrics() returns are valid already; anything else is made valid, not sent broken.
function metricName(name: string): string {
  return name.replace(/[^a-zA-Z0-9_:]/g, "_").replace(/^(?=[0-9])/, "_");
}

function labelName(name: string): string {
  return name.replace(/[^a-zA-Z0-9_]/g, "_").replace(/^(?=[0-9])/, "_");
}
