// The XPath box: sends a `query` request as the user types (debounced), shows the match
// count and `_query_error`, follows `_query` when Python sets it, and takes palette drops
// (a drop replaces every match).
import { h } from "./dom.js";

export const DEBOUNCE_MS = 40;

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
  const el = h("div", { class: "yax-query" }, h("div", { class: "yax-query-row" }, input, count), error);

  async function run() {
    try {
      const reply = await request("query", { xpath: input.value });
      count.textContent = input.value.trim() ? `${reply.count} match${reply.count === 1 ? "" : "es"}` : "";
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
    },
    dispose() { clearTimeout(timer); },
  };
}
