// Preloaded before the function's own index.ts (`deno run --preload`) by tests/edge: a
// stand-in for the Edge runtime's EdgeRuntime.waitUntil(). It keeps the function alive until
// the work handed to it settles; then, as the platform may, it ends the function at once, so
// whatever the function did not hand over (a request still in flight) is cut off.
//
// With EDGE_RUNTIME_UNLOAD_AFTER_MS, the isolate is also unloaded that long after it started,
// as the platform does at its wall-clock limit or on a CPU or memory limit: a `beforeunload`
// event first (a CustomEvent whose detail.reason is EDGE_RUNTIME_UNLOAD_REASON, default
// "wall_clock", as the runtime's dispatchBeforeUnloadEvent() sends it), then the end of the
// process once the work handed over settles, or after EDGE_RUNTIME_UNLOAD_GRACE_MS (default
// 1000) at the latest.
let open = 0;

function exit(reason: string): never {
  console.log(JSON.stringify({ event: "edge_runtime.shutdown", reason }));
  Deno.exit(0);
}

function waitUntil(work: Promise<unknown>): void {
  open += 1;
  work.finally(() => {
    open -= 1;
    if (open === 0) exit("work settled");
  });
}

Object.assign(globalThis, { EdgeRuntime: { waitUntil } });

const unloadAfterMs = Number(
  Deno.env.get("EDGE_RUNTIME_UNLOAD_AFTER_MS") ?? "",
);
if (unloadAfterMs > 0) {
  const graceMs = Number(
    Deno.env.get("EDGE_RUNTIME_UNLOAD_GRACE_MS") ?? "1000",
  );
  // Unreferenced: Deno finishes a preloaded module's pending work before it runs the main one.
  Deno.unrefTimer(setTimeout(() => {
    console.log(JSON.stringify({ event: "edge_runtime.beforeunload" }));
    const reason = Deno.env.get("EDGE_RUNTIME_UNLOAD_REASON") ?? "wall_clock";
    dispatchEvent(new CustomEvent("beforeunload", { cancelable: true, detail: { reason } }));
    if (open === 0) exit("unloaded, no work");
    setTimeout(() => exit("unloaded, grace over"), graceMs);
  }, unloadAfterMs));
}
