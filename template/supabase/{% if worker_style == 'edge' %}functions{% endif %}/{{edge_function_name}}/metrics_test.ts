import assert from "node:assert/strict";
import { escapeLabelValue, formatPrometheus } from "./metrics.ts";

Deno.test("each metric gets HELP and TYPE once, then a line per sample", () => {
  const text = formatPrometheus([
    { metric: "pgqueue_jobs_queued", labels: { kind: "email", queue: "default" }, value: 3 },
    { metric: "pgqueue_jobs_queued", labels: { kind: "sms", queue: "default" }, value: 0 },
    { metric: "pgqueue_lease_rescues_total", labels: {}, value: 12 },
    { metric: "pgqueue_oldest_runnable_age_seconds", labels: { queue: "q" }, value: 1.25 },
  ]);
  assert.equal(
    text,
    [
      "# HELP pgqueue_jobs_queued Jobs in the queue, due now or later.",
      "# TYPE pgqueue_jobs_queued gauge",
      'pgqueue_jobs_queued{kind="email",queue="default"} 3',
      'pgqueue_jobs_queued{kind="sms",queue="default"} 0',
      "# HELP pgqueue_lease_rescues_total Expired leases the sweeper put back in the queue.",
      "# TYPE pgqueue_lease_rescues_total counter",
      "pgqueue_lease_rescues_total 12",
      "# HELP pgqueue_oldest_runnable_age_seconds How long the queue's longest-waiting " +
      "runnable job has been due (0: none is).",
      "# TYPE pgqueue_oldest_runnable_age_seconds gauge",
      'pgqueue_oldest_runnable_age_seconds{queue="q"} 1.25',
      "",
    ].join("\n"),
  );
});

Deno.test("the waiting jobs' HELP says they wait for other jobs to finish", () => {
  const text = formatPrometheus([
    { metric: "pgqueue_jobs_waiting", labels: { kind: "zip", queue: "default" }, value: 2 },
  ]);
  assert.equal(
    text.split("\n")[0],
    "# HELP pgqueue_jobs_waiting Jobs waiting for other jobs to finish (their depends_on): " +
      "not claimable until then.",
  );
  assert.match(text, /^pgqueue_jobs_waiting\{kind="zip",queue="default"\} 2$/m);
});

Deno.test("label values escape backslash, double quote and newline", () => {
  assert.equal(escapeLabelValue('a\\b"c\nd'), 'a\\\\b\\"c\\nd');
  const text = formatPrometheus([
    { metric: "pgqueue_jobs_queued", labels: { queue: 'we"ird\\\nq', kind: "k" }, value: 1 },
  ]);
  assert.match(text, /^pgqueue_jobs_queued\{queue="we\\"ird\\\\\\nq",kind="k"\} 1$/m);
});

Deno.test("an unknown metric is still typed by its name, and odd values are spelled out", () => {
  const text = formatPrometheus([
    { metric: "pgqueue_new_things_total", labels: {}, value: Infinity },
    { metric: "pgqueue_new-gauge", labels: { "bad-label": "x" }, value: NaN },
  ]);
  assert.match(text, /^# TYPE pgqueue_new_things_total counter$/m);
  assert.match(text, /^pgqueue_new_things_total \+Inf$/m);
  assert.match(text, /^# TYPE pgqueue_new_gauge gauge$/m);
  assert.match(text, /^pgqueue_new_gauge\{bad_label="x"\} NaN$/m);
});

Deno.test("no samples, no text", () => {
  assert.equal(formatPrometheus([]), "");
});
