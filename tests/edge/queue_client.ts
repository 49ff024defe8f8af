// tests/edge: queue.ts's client, run against the Data API the environment names
// (SUPABASE_URL, SUPABASE_SERVICE_ROLE_KEY) from a copy of the rendered function. Each line
// of stdin is one call, `["method", ...args]`; each line of stdout is its answer,
// `{"ok": value}`, or `{"error": {...}}` with the QueueError's fields.
import { type Queue, QueueError, supabaseQueue } from "./queue.ts";
import { loadSettings } from "./settings.ts";

const queue = supabaseQueue(loadSettings());
const calls = (await new Response(Deno.stdin.readable).text()).split("\n")
  .filter(Boolean);
for (const line of calls) {
  const [method, ...args] = JSON.parse(line) as [keyof Queue, ...unknown[]];
  try {
    const value = await (queue[method] as (...args: unknown[]) => Promise<unknown>)(
      ...args,
    );
    // a Map (traceContexts()) as an object of its entries
    const json = JSON.stringify(
      { ok: value ?? null },
      (_, v) => v instanceof Map ? Object.fromEntries(v) : v,
    );
    console.log(json);
  } catch (error) {
    if (!(error instanceof QueueError)) throw error;
    const { name, call, code, reason, message } = error;
    console.log(
      JSON.stringify({ error: { name, call, code, reason, message } }),
    );
  }
}
