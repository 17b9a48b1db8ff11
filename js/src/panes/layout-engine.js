// Graphviz (@viz-js/viz: Graphviz compiled to WebAssembly) laying out DOT as SVG text: the entry
// of the graph pane's Web Worker. The build (js/build.mjs) bundles this file on its own and puts
// the result in widget.js as a string (layout-code.js), from which the pane starts a worker from a
// Blob URL (no file, no network): a large graph's layout never blocks the page, and a runaway one
// is stopped by ending the worker. Where no worker can be had (jsdom, a page forbidding them) the
// pane imports this module and lays out on the main thread.
import { instance } from "@viz-js/viz";

let viz = null;

/** `dot` laid out as SVG text; throws Graphviz's message on a graph it refuses. */
export async function layout(dot) {
  viz ??= instance();
  return (await viz).renderString(dot, { format: "svg" });
}

// in a worker: {ready} once loaded; then {id, dot} in, {id, svg, ms} or {id, error} out
if (typeof WorkerGlobalScope !== "undefined" && globalThis instanceof WorkerGlobalScope) {
  globalThis.postMessage({ ready: true });
  globalThis.onmessage = async ({ data }) => {
    const t0 = performance.now();
    try {
      const svg = await layout(data.dot);
      globalThis.postMessage({ id: data.id, svg, ms: performance.now() - t0 });
    } catch (err) {
      globalThis.postMessage({ id: data.id, error: String(err?.message || err) });
    }
  };
}
