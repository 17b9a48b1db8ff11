// Requests to Python: a custom message `{type, ...payload, rid}`, answered by a custom
// message with the same `rid` (docs/widget.md, "Requests"). Each request settles once:
// resolved with an `ok` reply, rejected with a RequestError on an `error` reply, or rejected
// when no reply came in time (the kernel is busy running a cell, or gone) instead of
// leaving its caller waiting forever. A reply that comes after that is dropped.

export const DEFAULT_TIMEOUT_MS = 60_000;

/** Why a request failed: `message` is the kernel's (an error reply) or says it timed out;
 * `timedOut` tells the two apart; `reply` is the error reply, if any. */
export class RequestError extends Error {
  constructor(message, { type, timedOut = false, reply = null } = {}) {
    super(message);
    this.name = "RequestError";
    this.type = type;
    this.timedOut = timedOut;
    this.reply = reply;
  }
}

const seconds = (ms) => (ms >= 1000 ? `${Math.round(ms / 100) / 10} s` : `${ms} ms`);

/**
 * Requests over `model` (anywidget's: `send`, `on`/`off` "msg:custom").
 * Returns `{request(type, payload, {timeoutMs}), dispose()}`; `timeoutMs` is the default limit.
 *
 *   const { request } = createRequests(model);
 *   const { count } = await request("query", { xpath: "//gelu" });  // throws RequestError
 */
export function createRequests(model, { timeoutMs = DEFAULT_TIMEOUT_MS } = {}) {
  // Every view of a model hears every reply: each view numbers its requests from its own
  // random start, so that two views of one widget do not take each other's replies.
  let rid = Math.floor(Math.random() * 2 ** 30);
  const pending = new Map(); // rid -> {type, resolve, reject, timer}

  const onReply = (msg) => {
    if (!msg || typeof msg.rid !== "number") return;
    const p = pending.get(msg.rid);
    if (!p) return; // another view's, or one that timed out
    pending.delete(msg.rid);
    clearTimeout(p.timer);
    if (msg.type === "error") {
      p.reject(new RequestError(msg.message || `The kernel refused \`${p.type}\`.`, { type: p.type, reply: msg }));
    } else {
      p.resolve(msg);
    }
  };
  model.on("msg:custom", onReply);

  function request(type, payload = {}, { timeoutMs: limit = timeoutMs } = {}) {
    rid += 1;
    const id = rid;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        pending.delete(id);
        reject(new RequestError(`No reply from the kernel to \`${type}\` within ${seconds(limit)}: `
          + "is it busy running a cell, or stopped?", { type, timedOut: true }));
      }, limit);
      pending.set(id, { type, resolve, reject, timer });
      try {
        model.send({ ...payload, type, rid: id });
      } catch (err) {
        pending.delete(id);
        clearTimeout(timer);
        reject(new RequestError(`Could not send \`${type}\` to the kernel: ${err.message || err}`, { type }));
      }
    });
  }

  /** Stop listening; requests still pending never settle (their view is gone). */
  function dispose() {
    model.off("msg:custom", onReply);
    for (const p of pending.values()) clearTimeout(p.timer);
    pending.clear();
  }

  return { request, dispose };
}
