// The test helpers for your handlers (testing_run.ts, testing_enqueue.ts): each does what its
// README example says, and fails a test when it should, saying why.
import assert from "node:assert/strict";
import { z } from "zod";
import { defineHandler, PermanentError, RetryAfter } from "./job.ts";
import { QueueError } from "./queue.ts";
import { ResultError } from "./run_job.ts";
import {
  assertEnqueued,
  HandlerTimedOut,
  refuteEnqueued,
  runJob,
  withFakeDataApi,
} from "./testing.ts";

const handlers = {
  resize: defineHandler(
    z.object({ width: z.number() }),
    async ({ width }, { job, reportProgress }) => {
      await reportProgress({ step: 1 });
      await reportProgress({ step: 2 });
      return { width, job: job.id, attempt: job.attempt, queue: job.queue };
    },
  ),
  stuck: defineHandler(z.object({}), () => new Promise(() => {})),
  obedient: defineHandler(
    z.object({}),
    (_payload, { signal }) =>
      new Promise((_resolve, reject) =>
        signal.addEventListener("abort", () => reject(signal.reason))
      ),
  ),
  bigint: defineHandler(z.object({}), () => ({ n: 1n })),
  limited: defineHandler(z.object({}), () => {
    throw new RetryAfter(30);
  }),
};

Deno.test("runJob runs the handler with a made-up job, keeping its progress and result", async () => {
  const ran = await runJob("resize", { width: 300 }, {
    handlers,
    job: { id: 7, attempt: 2, queue: "images" },
  });
  assert.deepEqual(ran.result, { width: 300, job: 7, attempt: 2, queue: "images" });
  assert.deepEqual(ran.progress, [{ step: 1 }, { step: 2 }]);
  assert.equal(ran.job.kind, "resize");
  assert.equal(ran.job.maxAttempts, 5);
});

Deno.test("runJob runs the project's own handlers by default", async () => {
  const ran = await runJob("send_email", { to: "ada@example.com", subject: "Hi", text: "." });
  assert.equal(ran.result, null);
});

Deno.test("runJob fails on a wrong payload, an unknown kind and a result the queue refuses", async () => {
  await assert.rejects(runJob("resize", { width: "wide" }, { handlers }), PermanentError);
  await assert.rejects(
    runJob("send_emial", {}, { handlers }),
    /no handler for "send_emial": registered are resize, stuck, obedient, bigint, limited/,
  );
  await assert.rejects(runJob("bigint", {}, { handlers }), ResultError);
  await assert.rejects(
    runJob("resize", { width: 300 }, { handlers, maxResultBytes: 10 }),
    /the handler's result is \d+ bytes of JSON; the limit is 10/,
  );
  await assert.rejects(runJob("limited", {}, { handlers }), (error) => {
    assert.ok(error instanceof RetryAfter);
    assert.equal(error.seconds, 30);
    return true;
  });
});

Deno.test("runJob fails a handler that never finishes once its timeout is up", async () => {
  for (const kind of ["stuck", "obedient"]) {
    await assert.rejects(runJob(kind, {}, { handlers, timeoutMs: 50 }), (error) => {
      assert.ok(error instanceof HandlerTimedOut, String(error));
      assert.match(
        error.message,
        new RegExp(`the handler of "${kind}" was still running after 50 ms`),
      );
      return true;
    });
  }
});

Deno.test("assertEnqueued finds a job by kind, payload subset, queue and run time", async () => {
  await withFakeDataApi(async (api) => {
    const soon = new Date(Date.now() + 60_000);
    await api.queue.enqueue("send_email", { to: "ada@example.com", subject: "Hi" }, {
      queue: "emails",
      runAfter: soon,
    });
    await api.queue.enqueueMany([{ kind: "sync_crm", payload: { account: 7 } }]);
    const found = assertEnqueued(api, {
      kind: "send_email",
      payload: { to: "ada@example.com" },
      queue: "emails",
      runAfter: soon,
    });
    assert.equal(found.id, 1);
    assert.equal(assertEnqueued(api, { kind: "sync_crm", queue: "default" }).id, 2);
    assert.ok(Math.abs(api.enqueued[1].runAfter.getTime() - Date.now()) < 1000);
    refuteEnqueued(api, { kind: "send_email", payload: { to: "bob@example.com" } });
  });
});

Deno.test("assertEnqueued fails on a wrong enqueue, listing what was enqueued", async () => {
  await withFakeDataApi(async (api) => {
    const inAnHour = new Date(Date.now() + 3_600_000);
    await api.queue.enqueue("send_email", { to: "ada@example.com" }, { runAfter: inAnHour });
    const wrong = [
      { kind: "send_emial" },
      { kind: "send_email", payload: { to: "bob@example.com" } },
      { kind: "send_email", queue: "emails" },
      { kind: "send_email", runAfter: new Date() },
    ];
    for (const wanted of wrong) {
      assert.throws(() => assertEnqueued(api, wanted), (error: Error) => {
        assert.ok(error instanceof assert.AssertionError);
        assert.match(error.message, /^no job enqueued with kind "send_(email|emial)"/);
        assert.match(error.message, /the jobs enqueued:\n {2}#1 send_email on "default", runAfter/);
        assert.match(error.message, /\{"to":"ada@example.com"\}$/);
        return true;
      });
    }
  });
  await withFakeDataApi((api) => {
    assert.throws(() => assertEnqueued(api, { kind: "send_email" }), /enqueued:\n {2}none$/);
    return Promise.resolve();
  });
});

Deno.test("refuteEnqueued fails when a matching job was enqueued, naming it", async () => {
  await withFakeDataApi(async (api) => {
    await api.queue.enqueue("send_email", { to: "ada@example.com", subject: "Hi" });
    assert.throws(
      () => refuteEnqueued(api, { kind: "send_email", payload: { to: "ada@example.com" } }),
      /expected no job enqueued with kind "send_email", a payload holding .*; enqueued:\n {2}#1/,
    );
  });
});

Deno.test("the fake Data API refuses the calls it does not record, naming them", async () => {
  await withFakeDataApi(async (api) => {
    await assert.rejects(api.queue.cancel(1), (error) => {
      assert.ok(error instanceof QueueError);
      assert.match(
        error.message,
        /records enqueue\(\) and enqueue_many\(\) only, not POST rpc\/cancel/,
      );
      return true;
    });
    assert.deepEqual(api.enqueued, []);
  });
});
