// A Data API on 127.0.0.1 that records each request it is sent (withApi), for the queue
// client's tests; testing.ts exports it with the other test helpers.
import { supabaseQueue } from "./queue.ts";

export interface Received {
  method: string;
  path: string;
  schema: string | null;
  body: unknown;
}

/**
 * A Data API on 127.0.0.1 that records each request and answers with `answer(path)`: a body
 * (200, JSON), or a Response.
 */
export async function withApi(
  answer: (path: string) => unknown,
  test: (queue: ReturnType<typeof supabaseQueue>, got: Received[]) => Promise<void>,
) {
  const got: Received[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const url = new URL(request.url);
    const path = url.pathname.replace("/rest/v1/", "") + url.search;
    got.push({
      method: request.method,
      path,
      schema: request.headers.get("content-profile") ?? request.headers.get("accept-profile"),
      body: request.method === "POST" ? await request.json() : null,
    });
    const body = answer(path);
    if (body instanceof Response) return body;
    return body === undefined
      ? new Response(null, { status: 204 })
      : Response.json(body, { status: 200 });
  });
  try {
    await test(
      supabaseQueue({
        supabaseUrl: `http://127.0.0.1:${server.addr.port}`,
        serviceKeys: ["service-key"],
        schema: "jobs_schema",
      }),
      got,
    );
  } finally {
    await server.shutdown();
  }
}
