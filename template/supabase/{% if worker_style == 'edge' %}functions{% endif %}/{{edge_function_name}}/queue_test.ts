import assert from "node:assert/strict";
import { type ClaimedJob, type Json, QueueError } from "./queue.ts";
import { withApi } from "./testing.ts";

const claimed: ClaimedJob = {
  id: 7,
  queue: "default",
  kind: "ok",
  payload: {},
  attempts: 1,
  max_attempts: 5,
  lock_token: crypto.randomUUID(),
  locked_at: "2026-01-01T00:00:00Z",
  locked_until: "2026-01-01T00:05:00Z",
  concurrency_key: null,
};

/** What each SQL function returns, in shape. */
function answerOfItsShape(path: string): unknown {
  const fn = path.replace("rpc/", "");
  const yesOrNo = ["pause", "resume", "unschedule", "complete", "progress", "release", "retry"];
  if ([...yesOrNo, "cancel"].includes(fn)) {
    return true;
  }
  if (fn === "configure") return { max_result_bytes: 1024 };
  if (fn === "throughput") return [];
  if (fn === "set_rate_limit") return undefined;
  return 1;
}

Deno.test("each job call sends its SQL function's named arguments", async () => {
  await withApi(answerOfItsShape, async (queue, got) => {
    await queue.enqueue("send_email", { to: "a@example.com" });
    await queue.enqueue("sync.crm", { account: 42 }, {
      runAfter: new Date("2026-01-01T00:00:30Z"),
      idempotencyKey: "sync:42",
      queue: "crm",
      priority: 5,
      maxAttempts: 3,
      concurrencyKey: "tenant-42",
      onConflict: "debounce",
      traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    });
    await queue.complete(claimed, { rows: 3 });
    await queue.complete(claimed);
    await queue.progress(claimed, { done: 1 });
    await queue.retry(7);
    await queue.retry(7, new Date("2026-01-02T00:00:00Z"));
    await queue.cancel(7);

    assert.ok(got.every((request) => request.method === "POST"));
    assert.ok(got.every((request) => request.schema === "jobs_schema"));
    assert.deepEqual(got.map(({ path, body }) => [path, body]), [
      ["rpc/enqueue", { kind: "send_email", payload: { to: "a@example.com" } }],
      ["rpc/enqueue", {
        kind: "sync.crm",
        payload: { account: 42 },
        run_after: "2026-01-01T00:00:30.000Z",
        idempotency_key: "sync:42",
        queue: "crm",
        priority: 5,
        max_attempts: 3,
        concurrency_key: "tenant-42",
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        on_conflict: "debounce",
      }],
      ["rpc/complete", { job_id: 7, lock_token: claimed.lock_token, result: { rows: 3 } }],
      ["rpc/complete", { job_id: 7, lock_token: claimed.lock_token, result: null }],
      ["rpc/progress", { job_id: 7, lock_token: claimed.lock_token, progress: { done: 1 } }],
      ["rpc/retry", { job_id: 7 }],
      ["rpc/retry", { job_id: 7, run_after: "2026-01-02T00:00:00.000Z" }],
      ["rpc/cancel", { job_id: 7 }],
    ]);
  });
});

Deno.test("each flow-control call sends its SQL function's named arguments", async () => {
  await withApi(answerOfItsShape, async (queue, got) => {
    await queue.setConcurrencyLimit("tenant-42", 2);
    await queue.setConcurrencyLimit("tenant-42", null);
    await queue.setConcurrencyLimit("ledger-7", 1, { strict: true });
    await queue.pause("emails");
    await queue.resume("emails");
    await queue.setRateLimit("webhooks", 50, 100);
    await queue.setRateLimit("webhooks", null);
    await queue.schedule("nightly", "0 3 * * *", "report.nightly");
    await queue.schedule("digest", "0 9 * * *", "digest", {}, "default", {
      timeZone: "Europe/Paris",
      catchUp: true,
    });
    await queue.unschedule("nightly");
    await queue.configure({ max_result_bytes: 1024 });
    await queue.throughput();
    await queue.throughput(60);

    assert.ok(got.every((request) => request.method === "POST"));
    assert.ok(got.every((request) => request.schema === "jobs_schema"));
    assert.deepEqual(got.map(({ path, body }) => [path, body]), [
      ["rpc/set_concurrency_limit", { concurrency_key: "tenant-42", max_running: 2 }],
      ["rpc/set_concurrency_limit", { concurrency_key: "tenant-42", max_running: null }],
      ["rpc/set_concurrency_limit", { concurrency_key: "ledger-7", max_running: 1, strict: true }],
      ["rpc/pause", { queue: "emails" }],
      ["rpc/resume", { queue: "emails" }],
      ["rpc/set_rate_limit", { queue: "webhooks", per_second: 50, burst: 100 }],
      ["rpc/set_rate_limit", { queue: "webhooks", per_second: null }],
      ["rpc/schedule", {
        name: "nightly",
        cron: "0 3 * * *",
        kind: "report.nightly",
        payload: {},
        queue: "default",
      }],
      ["rpc/schedule", {
        name: "digest",
        cron: "0 9 * * *",
        kind: "digest",
        payload: {},
        queue: "default",
        time_zone: "Europe/Paris",
        catch_up: true,
      }],
      ["rpc/unschedule", { name: "nightly" }],
      ["rpc/configure", { changes: { max_result_bytes: 1024 } }],
      ["rpc/throughput", { minutes: 30 }],
      ["rpc/throughput", { minutes: 60 }],
    ]);
  });
});

Deno.test("enqueueMany sends one array, each job's options under their SQL names", async () => {
  await withApi(() => [11, 12], async (queue, got) => {
    const ids = await queue.enqueueMany([
      { kind: "send_email" },
      { kind: "sync.crm", payload: { account: 7 }, concurrencyKey: "tenant-7", priority: 1 },
    ]);

    assert.deepEqual(ids, [11, 12]);
    assert.deepEqual(got[0].body, {
      jobs: [
        { kind: "send_email" },
        { kind: "sync.crm", payload: { account: 7 }, priority: 1, concurrency_key: "tenant-7" },
      ],
    });
  });
});

Deno.test("metrics(), health() and traceContexts() read their functions' rows", async () => {
  const sample = { metric: "pgqueue_jobs_queued", labels: { queue: "q", kind: "k" }, value: 3 };
  const check = { component: "pg_net", ok: true, detail: "pg_net is enabled" };
  const traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const rows: Record<string, unknown> = {
    "rpc/metrics": [sample],
    "rpc/health": [check],
    "rpc/trace_contexts": [{ id: 4, traceparent: traced }],
  };
  await withApi(
    (path) => rows[path],
    async (queue, got) => {
      assert.deepEqual(await queue.metrics(), [sample]);
      assert.deepEqual(await queue.health(), [check]);
      assert.deepEqual(await queue.traceContexts([4, 5]), new Map([[4, traced]]));
      assert.deepEqual(got.map(({ path, body }) => [path, body]), [
        ["rpc/metrics", {}],
        ["rpc/health", {}],
        ["rpc/trace_contexts", { job_ids: [4, 5] }],
      ]);
    },
  );
});

Deno.test("results go with completions only when a job has one", async () => {
  const row = { ...claimed, id: 8 } as Partial<ClaimedJob>;
  delete row.queue;
  await withApi(() => [row], async (queue, got) => {
    const claim = { worker: "w", queue: "mail", kinds: ["ok"], maxJobs: 10 };
    const jobs = await queue.completeAndClaim({ ...claim, done: [{ job: claimed, result: null }] });
    await queue.completeAndClaim({
      ...claim,
      done: [{ job: claimed, result: null }, { job: { ...claimed, id: 9 }, result: [1] }],
    });

    assert.deepEqual(jobs, [{ ...row, queue: "mail" }], "each row says which queue it is from");
    assert.deepEqual(got.map(({ body }) => body), [
      {
        worker: "w",
        done_ids: [7],
        done_tokens: [claimed.lock_token],
        max_jobs: 10,
        kinds: ["ok"],
        queue: "mail",
      },
      {
        worker: "w",
        done_ids: [7, 9],
        done_tokens: [claimed.lock_token, claimed.lock_token],
        max_jobs: 10,
        kinds: ["ok"],
        queue: "mail",
        done_results: '{NULL,"[1]"}',
      },
    ]);
  });
});

Deno.test("job() is the row, or null for an unknown id", async () => {
  const row = { id: 5, status: "done", result: { rows: 1 } };
  await withApi((path) => path.includes("rpc/job") ? [row] : [], async (queue, got) => {
    assert.deepEqual(await queue.job(5), row);
    assert.deepEqual(got[0].body, { job_id: 5 });
  });
  await withApi(() => [], async (queue) => {
    assert.equal(await queue.job(404), null);
  });
});

Deno.test("views and the config are read with GET", async () => {
  await withApi(
    (path) => path.startsWith("config") ? [{ max_result_bytes: 4096 }] : [{ queue: "default" }],
    async (queue, got) => {
      assert.deepEqual(await queue.stats(), [{ queue: "default" }]);
      await queue.queueStates();
      await queue.schedules();
      assert.equal(await queue.maxResultBytes(), 4096);

      assert.deepEqual(got.map(({ method, path, schema }) => [method, path, schema]), [
        ["GET", "stats?select=*&limit=1000", "jobs_schema"],
        ["GET", "queue_states?select=*&limit=1000", "jobs_schema"],
        ["GET", "schedules?select=*&limit=1000", "jobs_schema"],
        ["GET", "config?select=max_result_bytes&limit=1000", "jobs_schema"],
      ]);
    },
  );
});

Deno.test("a config without its row is a QueueError, never a limit made up", async () => {
  await withApi(() => [], async (queue) => {
    await assert.rejects(
      queue.maxResultBytes(),
      (error) =>
        error instanceof QueueError && error.call === "config" &&
        /returned \[\], not the config row, with its max_result_bytes/.test(error.message),
    );
  });
});

Deno.test("a database error is a QueueError naming the call, its SQLSTATE and the hint", async () => {
  const refused = Response.json({
    code: "54000",
    details: null,
    hint: "Fail the job instead.",
    message: "the result of job 7 is 70012 bytes; the limit is 65536 (max_result_bytes)",
  }, { status: 500 });
  await withApi(() => refused, async (queue) => {
    const error = await queue.complete(claimed, "x".repeat(70000)).catch((e) => e);
    assert.ok(error instanceof QueueError);
    assert.equal(error.call, "complete()");
    assert.equal(error.code, "54000");
    assert.equal(
      error.reason,
      "the result of job 7 is 70012 bytes; the limit is 65536 (max_result_bytes)",
    );
    assert.equal(error.hint, "Fail the job instead.");
    assert.match(
      error.message,
      /^jobs_schema\.complete\(\) failed through http:\/\/127\.0\.0\.1:\d+: the result of job 7 is 70012 bytes; the limit is 65536 \(max_result_bytes\) \(hint: Fail the job instead\.\)$/,
    );
  });
});

Deno.test("a value JSON cannot carry is a QueueError, before anything is sent", async () => {
  const node: Record<string, unknown> = {};
  node.self = node;
  await withApi(() => 1, async (queue, got) => {
    await assert.rejects(
      queue.enqueue("ok", node as Json),
      (error) => error instanceof QueueError && /enqueue\(\) failed .*circular/.test(error.message),
    );
    assert.equal(got.length, 0);
  });
});

Deno.test("a concurrency key the database would refuse is refused here, saying why", async () => {
  await withApi(() => 1, async (queue, got) => {
    for (const key of ["", "k".repeat(201)]) {
      await assert.rejects(
        queue.enqueue("ok", {}, { concurrencyKey: key }),
        /a concurrency key is 1 to 200 characters, got "k*"/,
      );
    }
    // 200 characters, however many UTF-16 units: as Postgres counts.
    await queue.enqueue("ok", {}, { concurrencyKey: "😀".repeat(200) });
    assert.equal(got.length, 1);
  });
});

Deno.test("an answer of the wrong shape is a QueueError saying what was expected", async () => {
  await withApi(
    (path) => path.startsWith("rpc/complete_and_claim") ? [{ id: "7" }] : "yes",
    async (queue) => {
      const claim = { worker: "w", queue: "q", kinds: ["ok"], maxJobs: 1, done: [] };
      await assert.rejects(
        queue.completeAndClaim(claim),
        (error) =>
          error instanceof QueueError && error.call === "complete_and_claim()" &&
          /returned \[\{"id":"7"\}\], not a list of claimed jobs: are the project's migrations applied/
            .test(error.message),
      );
      await assert.rejects(
        queue.complete(claimed),
        (error) =>
          error instanceof QueueError && /returned "yes", not true or false/.test(error.message),
      );
    },
  );
});

Deno.test("a view of 1000 rows or more is refused, never cut short", async () => {
  const rows = Array.from({ length: 1000 }, (_, n) => ({ queue: `q${n}` }));
  await withApi(() => rows, async (queue) => {
    await assert.rejects(
      queue.stats(),
      (error) =>
        error instanceof QueueError &&
        /stats has 1000 rows or more, the most the Data API returns at once/.test(error.message),
    );
  });
  await withApi(() => rows.slice(1), async (queue) => {
    assert.equal((await queue.stats()).length, 999);
  });
});

Deno.test("a call whose signal aborts gives up, with a QueueError", async () => {
  let answer = () => {};
  const held = new Promise<void>((resolve) => answer = resolve);
  await withApi(
    () => held.then(() => Response.json(true)),
    async (queue) => {
      const controller = new AbortController();
      const call = queue.release(claimed, controller.signal);
      controller.abort(new DOMException("timed out after 10 ms", "TimeoutError"));
      await assert.rejects(
        call,
        (error) => error instanceof QueueError && error.call === "release()" && error.code === "",
      );
      answer();
    },
  );
});

Deno.test("the client-kind calls and the worker's owner calls", async () => {
  const owner = "6f1c2d3e-0000-4000-8000-000000000001";
  const answers: Record<string, unknown> = {
    "rpc/allow_client_kind": undefined,
    "rpc/disallow_client_kind": true,
    "rpc/job_owners": [{ id: 4, owner }],
    "rpc/fail_user_facing": "failed",
    "client_kinds?select=kind,per_minute&limit=1000": [{ kind: "export_data", per_minute: 10 }],
    "client_kinds?select=kind&limit=1000": [{ kind: "export_data" }],
  };
  await withApi(
    (path) => answers[decodeURIComponent(path)],
    async (queue, got) => {
      await queue.allowClientKind("export_data", 10);
      await queue.allowClientKind("export_data", 10, { maxPerUser: 5, maxTotal: 500 });
      assert.equal(await queue.disallowClientKind("export_data"), true);
      assert.deepEqual(await queue.allowedClientKinds(), [{ kind: "export_data", per_minute: 10 }]);
      assert.deepEqual(await queue.clientKinds(), ["export_data"]);
      assert.deepEqual(await queue.jobOwners([4, 5]), new Map([[4, owner]]));
      const mine = { ...claimed, id: 4, lock_token: owner };
      assert.equal(await queue.failUserFacing(mine, "too big"), "failed");
      const sent = got.map(({ method, path, body }) => [method, decodeURIComponent(path), body]);
      assert.deepEqual(sent, [
        ["POST", "rpc/allow_client_kind", { kind: "export_data", per_minute: 10 }],
        [
          "POST",
          "rpc/allow_client_kind",
          { kind: "export_data", per_minute: 10, max_per_user: 5, max_total: 500 },
        ],
        ["POST", "rpc/disallow_client_kind", { kind: "export_data" }],
        ["GET", "client_kinds?select=kind,per_minute&limit=1000", null],
        ["GET", "client_kinds?select=kind&limit=1000", null],
        ["POST", "rpc/job_owners", { job_ids: [4, 5] }],
        ["POST", "rpc/fail_user_facing", { job_id: 4, lock_token: owner, message: "too big" }],
      ]);
    },
  );
});
