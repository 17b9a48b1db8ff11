// The status area in the toolbar: the kernel's `_status` message, or the message of the
// last request that failed, until a later request succeeds or the kernel's status changes.
import { h } from "./dom.js";

export function createStatus(model) {
  const el = h("span", { class: "yax-status", role: "status" });
  let failure = "";
  const show = () => {
    el.textContent = failure || (model.get("_status") || {}).message || "";
    el.classList.toggle("yax-failed", !!failure);
    if (el.textContent) el.title = el.textContent; // all of it, where the toolbar cuts it short
    else el.removeAttribute("title");
  };
  return {
    el,
    /** Is the kernel busy (compiling and comparing)? */
    busy: () => !!(model.get("_status") || {}).busy,
    /** `_status` changed: show the kernel's message. */
    update() { failure = ""; show(); },
    /** A request failed: show why. */
    fail(err) { failure = String((err && err.message) || err); show(); },
    /** A request succeeded: a failure shown before is stale. */
    ok() { if (failure) { failure = ""; show(); } },
  };
}
