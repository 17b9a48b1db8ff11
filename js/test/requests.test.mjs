import assert from "node:assert/strict";
import { test } from "node:test";
import { createRequests, RequestError } from "../src/requests.js";

/** A model that records what is sent and lets the test deliver replies. */
function fakeModel() {
  const listeners = new Set();
  return {
    sent: [],
    listeners,
    on(name, f) { if (name === "msg:custom") listeners.add(f); },
    off(name, f) { if (name === "msg:custom") listeners.delete(f); },
    send(msg) { this.sent.push(msg); },
    reply(msg) { for (const f of [...listeners]) f(msg, []); },
  };
}

test("a request sends type, payload and a rid, and resolves on the reply with that rid", async () => {
  const model = fakeModel();
  const { request } = createRequests(model);
  const p = request("query", { xpath: "//gelu" });
  const [msg] = model.sent;
  assert.equal(msg.type, "query");
  assert.equal(msg.xpath, "//gelu");
  assert.ok(Number.isInteger(msg.rid));
  model.reply({ type: "ok", rid: msg.rid + 1, count: 99 }); // not ours
  model.reply({ type: "ok", rid: msg.rid, count: 2 });
  assert.deepEqual(await p, { type: "ok", rid: msg.rid, count: 2 });
});

test("an error reply rejects with the kernel's message", async () => {
  const model = fakeModel();
  const { request } = createRequests(model);
  const p = request("undo");
  model.reply({ type: "error", rid: model.sent[0].rid, message: "Nothing to undo." });
  await assert.rejects(p, (err) => err instanceof RequestError && err.message === "Nothing to undo."
    && !err.timedOut && err.type === "undo" && err.reply.type === "error");
});

test("no reply rejects after the timeout; a late reply is dropped", async () => {
  const model = fakeModel();
  const { request } = createRequests(model, { timeoutMs: 20 });
  const t0 = performance.now();
  await assert.rejects(request("code"), (err) => err.timedOut && /`code` within 20 ms/.test(err.message));
  assert.ok(performance.now() - t0 >= 19);
  model.reply({ type: "ok", rid: model.sent[0].rid, code: "late" }); // nothing left to settle: no error
  const slow = request("undo", {}, { timeoutMs: 60 }); // a per-request limit
  setTimeout(() => model.reply({ type: "ok", rid: model.sent[1].rid }), 30);
  assert.equal((await slow).type, "ok");
});

test("two views of one model do not take each other's replies", async () => {
  const model = fakeModel();
  const a = createRequests(model);
  const b = createRequests(model);
  const pa = a.request("fits", { id: 1 });
  const pb = b.request("fits", { id: 2 });
  const [ma, mb] = model.sent;
  assert.notEqual(ma.rid, mb.rid);
  model.reply({ type: "ok", rid: mb.rid, fits: ["b"] });
  model.reply({ type: "ok", rid: ma.rid, fits: ["a"] });
  assert.deepEqual([(await pa).fits, (await pb).fits], [["a"], ["b"]]);
});

test("a send that throws rejects; dispose stops listening and clears the timers", async () => {
  const model = fakeModel();
  model.send = () => { throw new Error("comm closed"); };
  const r = createRequests(model, { timeoutMs: 10 });
  await assert.rejects(r.request("query", { xpath: "" }), /comm closed/);
  r.dispose();
  assert.equal(model.listeners.size, 0);
});
