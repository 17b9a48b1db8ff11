// Laying out DOT off the main thread: the graph pane's client of the layout engine
// (layout-engine.js) running in a Web Worker. One layout at a time: a new one stops the one
// under way (the worker is ended and started again), and one that runs past its time is stopped
// the same way, so neither the page nor the kernel ever waits on Graphviz.
import code from "./layout-code.js";

/** Why a layout promise was rejected without Graphviz failing: `reason` "stopped" (a newer
 * layout, or `stop()`) or "timeout". */
export class LayoutStopped extends Error {
  constructor(reason, ms) {
    super(reason === "timeout" ? `Graphviz took longer than ${Math.round(ms / 1000)} s and was stopped.`
      : "The layout was stopped.");
    this.reason = reason;
  }
}

/** The engine module on the main thread (no worker): from the bundled code, or, in js/src, the
 * engine file beside this one (a path esbuild does not follow, so the bundle holds it once). */
const engines = new Map();
const engineHere = (source) => {
  if (!engines.has(source)) engines.set(source, source ? importText(source)
    : import(new URL("./layout-engine.js", import.meta.url).href));
  return engines.get(source);
};

/** A module from its text: from a blob: URL (a saved snapshot's page allows those, as its bundle
 * comes so), else a data: URL (Node, which imports no blob: URL). */
async function importText(source) {
  try {
    return await import(URL.createObjectURL(new Blob([source], { type: "text/javascript" })));
  } catch {
    return import(`data:text/javascript,${encodeURIComponent(source)}`);
  }
}

/** `{run(dot) -> Promise<{svg, ms, worker}>, stop(), dispose()}`. `timeoutMs`: a worker's layout
 * is stopped after it (on the main thread none can be). `source` (the engine's code) and `Worker`
 * are the bundle's and the page's; tests pass their own. */
export function createLayout({ timeoutMs = 60_000, source = code, Worker = globalThis.Worker } = {}) {
  let worker = null; // null: not started; false: none to be had (the main thread lays out)
  let url = null;
  let pending = null; // {id, resolve, reject, timer}
  let seq = 0;

  const end = () => {
    worker?.terminate?.();
    worker = null;
  };
  const settle = (f, value) => {
    const p = pending;
    pending = null;
    clearTimeout(p?.timer);
    if (p) f === "resolve" ? p.resolve(value) : p.reject(value);
  };
  const start = () => {
    if (worker !== null) return worker;
    if (!source || typeof Worker !== "function" || typeof Blob === "undefined") return (worker = false);
    try {
      url ??= URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      worker = new Worker(url, { type: "module" });
    } catch {
      return (worker = false); // a page that forbids workers from Blob URLs
    }
    let ready = false; // the worker has loaded: an error now is Graphviz's, not a page without workers
    worker.onmessage = ({ data }) => {
      if (data.ready) ready = true;
      if (!pending || data.id !== pending.id) return;
      if (data.error) settle("reject", new Error(data.error));
      else settle("resolve", { svg: data.svg, ms: data.ms, worker: true });
    };
    worker.onerror = (e) => {
      e.preventDefault?.();
      const p = pending;
      pending = null;
      clearTimeout(p?.timer);
      end();
      if (ready) { // it died laying out (out of memory): said, and the next layout starts a new one
        p?.reject(new Error(e.message || "the layout worker stopped"));
        return;
      }
      worker = false; // it could not start (module workers unsupported): the main thread lays out
      if (p) onMain(p.dot).then(p.resolve, p.reject);
    };
    return worker;
  };
  const onMain = async (dot) => {
    const t0 = performance.now();
    const svg = await (await engineHere(source)).layout(dot);
    return { svg, ms: performance.now() - t0, worker: false };
  };

  function stop(reason = "stopped") {
    if (!pending) return;
    end(); // Graphviz cannot be interrupted inside the worker: the worker goes
    settle("reject", new LayoutStopped(reason, timeoutMs));
  }

  function run(dot) {
    stop();
    const w = start();
    if (!w) return onMain(dot);
    return new Promise((resolve, reject) => {
      const id = ++seq;
      pending = { id, dot, resolve, reject, timer: setTimeout(() => stop("timeout"), timeoutMs) };
      w.postMessage({ id, dot });
    });
  }

  function dispose() {
    stop();
    end();
    if (url) URL.revokeObjectURL(url);
    url = null;
  }

  return { run, stop, dispose };
}
