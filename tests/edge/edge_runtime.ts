// Preloaded before the function's own index.ts (`deno run --preload`) by tests/edge: a
// stand-in for the Edge runtime's EdgeRuntime.waitUntil(). It keeps the function alive until
// the work handed to it settles; then, as the platform may, it ends the function at once, so
// whatever the function did not hand over (a request still in flight) is cut off.
let open = 0;

function waitUntil(work: Promise<unknown>): void {
  open += 1;
  work.finally(() => {
    open -= 1;
    if (open > 0) return;
    console.log(JSON.stringify({ event: "edge_runtime.shutdown" }));
    Deno.exit(0);
  });
}

Object.assign(globalThis, { EdgeRuntime: { waitUntil } });
