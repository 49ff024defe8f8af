// The job worker: the database POSTs here when jobs arrive (pg_net), and the function runs
// them; GET .../metrics serves the queue's metrics to Prometheus. Your code goes in
// handlers/; the rest is machinery you should not need to touch.
import { handlers } from "./handlers/mod.ts";
import { createWakeHandler } from "./http.ts";
import { supabaseQueue } from "./queue.ts";
import { loadSettings } from "./settings.ts";

const settings = loadSettings();
const queue = supabaseQueue(settings);

Deno.serve(
  createWakeHandler({ settings, handlers, queue, metrics: () => queue.metrics() }),
);
