// The XPath box: sends a `query` request as the user types (debounced), shows what the query
// returned (`_query_result`: a match count, a value, a list of strings; where an empty result
// stops matching), follows `_query` when Python sets it, and takes palette drops (a drop
// replaces every match). A query Python refuses changes no synced state: its reply's message is
// this box's own (UI) state, shown under it until the next query runs; `_query_error` is the
// synced query's failure on a changed model.
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

/** What a refused drop on the box offers when the replacement fits some of the matches (the error
 * reply's `fits`: their ids; `matches`: how many there are): `{ids, label}` of the button replacing
 * just those, or null when it offers nothing. */
export function partialOffer(reply) {
  const ids = reply && Array.isArray(reply.fits) ? reply.fits : [];
  if (!ids.length) return null;
  const k = ids.length;
  return { ids, label: `Replace just the ${plural(k, "match", "matches")} of ${reply.matches} that ${k === 1 ? "fits" : "fit"}` };
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

  let refused = ""; // the message of the query last refused, while the box shows it (UI state)
  const errorText = () => {
    if (!refused) return model.get("_query_error") || "";
    const ran = model.get("_query") || "";  // a refused query changes nothing: say what the highlight still shows
    return ran.trim() ? `${refused}\nThe highlight still shows the last query that ran: ${ran}` : refused;
  };

  /** `_query_result` changed: the count (or value) and, for an empty result, where it stops matching. */
  function syncResult() {
    const r = resultText(model.get("_query_result"));
    if (errorText()) r.explain = "";
    else {
      count.textContent = r.text;
      count.title = r.title;
    }
    explain.textContent = r.explain;
    explain.style.display = r.explain ? "" : "none";
  }

  function showError() {
    const msg = errorText();
    error.textContent = msg;
    error.style.display = msg ? "" : "none";
    input.classList.toggle("yax-invalid", !!msg);
    if (msg) count.textContent = "";
    syncResult();
  }

  async function run() {
    const text = input.value;
    try {
      await request("query", { xpath: text }); // the count comes with `_query_result`
      if (input.value === text) refused = "";
    } catch (err) {
      // a timeout goes to the status area; a refused query's message stays under the box
      if (err.timedOut) onFailure(err);
      else if (input.value === text) refused = err.message;
    }
    showError();
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
      if (q !== input.value && document.activeElement !== input) {
        input.value = q;
        refused = ""; // the box shows the query Python ran
        showError();
      }
    },
    /** `_query_error` changed. */
    syncError: showError,
    syncResult,
    dispose() { clearTimeout(timer); },
  };
}
