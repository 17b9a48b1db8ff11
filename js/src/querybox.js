// The XPath box: sends a `query` request as the user types (debounced), shows what the query
// returned (`_query_result`: a match count, a value, a list of strings; where an empty result
// stops matching) and `_query_error`, follows `_query` when Python sets it, and takes palette
// drops (a drop replaces every match).
import { h } from "./dom.js";

export const DEBOUNCE_MS = 40;

const plural = (n, one, many) => `${n.toLocaleString("en-US")} ${n === 1 ? one : many}`;

/** What the box says about a `_query_result`: `{text, title, explain}` (`explain`: `yax.explain`'s
 * text for an empty node-set, shown under the box). */
export function resultText(r) {
  if (!r || !r.kind) return { text: "", title: "", explain: "" };
  if (r.kind === "value") {
    const v = typeof r.value === "string" ? JSON.stringify(r.value) : String(r.value);
    return { text: `= ${v.length > 40 ? `${v.slice(0, 39)}…` : v}`, title: `the query's value: ${v}`, explain: "" };
  }
  if (r.kind === "values") {
    const more = r.count > r.values.length ? `\n… and ${r.count - r.values.length} more` : "";
    return { text: `${plural(r.count, "value", "values")} (not nodes: nothing to highlight)`,
      title: r.values.join("\n") + more, explain: "" };
  }
  return { text: plural(r.count, "match", "matches"), title: "",
    explain: r.count === 0 && r.explain ? `No node matches. Where the query stops matching (yax.explain):\n${r.explain}` : "" };
}

/**
 * `request(type, payload)` sends a request (requests.js); `onFailure(err)` shows a failure
 * in the status area; `onDrop(name)` substitutes palette item `name` for the matches.
 * Returns `{el, input, syncText(), syncError(), dispose()}`.
 */
export function createQueryBox({ model, request, onFailure, onDrop, debounceMs = DEBOUNCE_MS }) {
  const input = h("input", { type: "text", placeholder: "XPath, e.g. //module_call[@type=\"Dense\"]",
    spellcheck: "false", "aria-label": "XPath query" });
  const count = h("span", { class: "yax-count" });
  const error = h("div", { class: "yax-query-error", role: "alert" });
  const explain = h("pre", { class: "yax-query-explain", style: { display: "none" } });
  const el = h("div", { class: "yax-query" }, h("div", { class: "yax-query-row" }, input, count), error, explain);

  /** `_query_result` changed: the count (or value) and, for an empty result, where it stops matching. */
  function syncResult() {
    const r = resultText(model.get("_query_result"));
    if (model.get("_query_error")) r.explain = "";
    else {
      count.textContent = r.text;
      count.title = r.title;
    }
    explain.textContent = r.explain;
    explain.style.display = r.explain ? "" : "none";
  }

  async function run() {
    try {
      await request("query", { xpath: input.value }); // the count comes with `_query_result`
    } catch (err) {
      // An invalid query's message is shown under the box already (`_query_error`, set before
      // the reply); any other failure (a timeout, a malformed request) goes to the status area.
      if (err.timedOut || err.message !== model.get("_query_error")) onFailure(err);
    }
  }

  let timer = 0;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(run, debounceMs);
  });

  el.addEventListener("dragover", (e) => { e.preventDefault(); el.classList.add("yax-dropping"); });
  el.addEventListener("dragleave", () => el.classList.remove("yax-dropping"));
  el.addEventListener("drop", (e) => {
    e.preventDefault();
    el.classList.remove("yax-dropping");
    const name = e.dataTransfer.getData("text/plain");
    if (name) onDrop(name);
  });

  return {
    el,
    input,
    /** `_query` changed (Python may set it): show it unless the user is typing. */
    syncText() {
      const q = model.get("_query");
      if (q !== input.value && document.activeElement !== input) input.value = q;
    },
    /** `_query_error` changed. */
    syncError() {
      const msg = model.get("_query_error");
      error.textContent = msg;
      error.style.display = msg ? "" : "none";
      input.classList.toggle("yax-invalid", !!msg);
      if (msg) count.textContent = "";
      syncResult();
    },
    syncResult,
    dispose() { clearTimeout(timer); },
  };
}
