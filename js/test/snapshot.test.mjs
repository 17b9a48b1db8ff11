// The snapshot's stand-in for the anywidget model (snapshot.js): recorded traits and replies,
// buffers as DataViews, and a sentence for every request the kernel did not answer beforehand.
import assert from "node:assert/strict";
import { test } from "node:test";
import { createRequests, RequestError } from "../src/requests.js";
import { decode, kernelOnly, requestKey, snapshotModel } from "../src/snapshot.js";

const data = {
  state: { _history: { items: ["replaced"], index: 1 },
    _comparison: { outputs: [{ heat: { diff: { $bytes: Buffer.from(Float32Array.of(1.5, -2).buffer).toString("base64") } } }] } },
  replies: [
    { request: { type: "expand", id: 7 },
      reply: { type: "ok", id: 7, columns: ["id", "primitive", "ins", "outs", "params"], rows: [[8, "add", "", "", ""]] } },
    { request: { depth: 1, id: null, type: "graph" }, reply: { type: "ok", id: null, dot: "digraph {}" } },
    { request: { type: "values", id: 3 }, reply: { type: "error", message: "Values need concrete parameters." } },
  ],
};

test("a request's key is its fields in sorted order, without the rid", () => {
  assert.equal(requestKey({ type: "graph", id: null, depth: 1, rid: 5 }), requestKey({ depth: 1, type: "graph", id: null }));
  assert.notEqual(requestKey({ type: "expand", id: 7 }), requestKey({ type: "expand", id: 8 }));
});

test("recorded buffers come back as the DataViews anywidget gives", () => {
  const view = snapshotModel(data).get("_comparison").outputs[0].heat.diff;
  assert.ok(view instanceof DataView);
  assert.deepEqual([view.getFloat32(0, true), view.getFloat32(4, true)], [1.5, -2]);
  assert.deepEqual(decode({ a: [1, { b: "x" }] }), { a: [1, { b: "x" }] });
});

test("the stand-in serves traits, answers recorded requests and refuses the rest in a sentence", async () => {
  const model = snapshotModel(data);
  assert.deepEqual(model.get("_history"), { items: ["replaced"], index: 1 });
  assert.equal(model.get("_nothing"), undefined);
  model.save_changes();
  const { request } = createRequests(model, { timeoutMs: 1000 });
  assert.deepEqual((await request("expand", { id: 7 })).rows, [[8, "add", "", "", ""]]);
  assert.equal((await request("graph", { id: null, depth: 1 })).dot, "digraph {}");
  // several calls at once ("expand all"): from their recorded `expand` replies, or refused as a whole
  const several = await request("equations", { ids: [7] });
  assert.deepEqual(several.calls, [[7, [[8, "add", "", "", ""]]]]);
  assert.deepEqual(several.columns, ["id", "primitive", "ins", "outs", "params"]); // as the `expand` replies name them
  await assert.rejects(request("equations", { ids: [7, 9] }), { message: kernelOnly("list the equations of these calls") });
  // the kernel's own refusal, as it gave it
  await assert.rejects(request("values", { id: 3 }), { message: "Values need concrete parameters." });
  for (const [type, payload, what] of [["expand", { id: 9 }, "list the equations of this call"],
    ["substitute", { target: 4, name: "GELU" }, "make a change"], ["query", { xpath: "//x" }, "run a query"],
    ["graph", { id: null, depth: 2 }, "draw this graph"]]) {
    const err = await request(type, payload).then(() => null, (e) => e);
    assert.ok(err instanceof RequestError && !err.timedOut, type);
    assert.equal(err.message, kernelOnly(what));
    assert.match(err.message, /^This page is a snapshot saved by `save_html`, so it cannot .+: that needs the live kernel\./);
  }
});
