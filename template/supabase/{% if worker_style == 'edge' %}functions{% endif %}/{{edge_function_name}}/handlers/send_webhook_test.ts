import assert from "node:assert/strict";
import { PermanentError } from "../job.ts";
import { runJob } from "../testing.ts";

interface Received {
  headers: Headers;
  body: unknown;
}

/** A receiver on 127.0.0.1 that answers `status` and records what it got. */
async function withReceiver(status: number, test: (url: string, got: Received[]) => Promise<void>) {
  const got: Received[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    got.push({ headers: request.headers, body: await request.json() });
    return new Response(null, { status });
  });
  try {
    await test(`http://127.0.0.1:${server.addr.port}/hook`, got);
  } finally {
    await server.shutdown();
  }
}

Deno.test("the body is POSTed as JSON with a stable idempotency key", async () => {
  await withReceiver(204, async (url, got) => {
    await runJob("send_webhook", { url, body: { order: 7 }, headers: { "X-Signature": "abc" } }, {
      job: { id: 42 },
    });
    assert.equal(got.length, 1);
    assert.deepEqual(got[0].body, { order: 7 });
    assert.equal(got[0].headers.get("content-type"), "application/json");
    assert.equal(got[0].headers.get("idempotency-key"), "send_webhook-42");
    assert.equal(got[0].headers.get("x-signature"), "abc");
  });
});

Deno.test("a 5xx is an error worth retrying", async () => {
  await withReceiver(503, async (url) => {
    await assert.rejects(runJob("send_webhook", { url }), (error: Error) => {
      assert.ok(!(error instanceof PermanentError));
      assert.match(error.message, /answered 503/);
      return true;
    });
  });
});

Deno.test("a 4xx will not get better: a permanent error", async () => {
  await withReceiver(404, async (url) => {
    await assert.rejects(runJob("send_webhook", { url }), PermanentError);
  });
  await withReceiver(429, async (url) => {
    await assert.rejects(
      runJob("send_webhook", { url }),
      (error) => !(error instanceof PermanentError),
    );
  });
});

Deno.test("a payload without a valid URL is refused before any request", async () => {
  await assert.rejects(runJob("send_webhook", { url: "ftp://example.com" }), PermanentError);
  await assert.rejects(runJob("send_webhook", { body: {} }), /invalid payload for send_webhook/);
});
