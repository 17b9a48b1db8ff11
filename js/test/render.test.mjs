// render() in a DOM (jsdom) with a fake anywidget model that answers requests the way
// yax_widget/_explorer.py does: traits first, then the reply with the request's rid.
// The same tests run on the source and on the bundle that ships (yax_widget/static/widget.js).
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { afterEach, beforeEach, describe, test } from "node:test";
import { JSDOM, VirtualConsole } from "jsdom";
import {
  FIXTURE_CALL_COLUMNS, FIXTURE_EQUATION_COLUMNS, callRow, equationRow, fixtureRecords, treeRecords, treeTrait,
} from "../src/rows.js";

// -- a DOM --------------------------------------------------------------------------------
const jsdomErrors = [];
const virtualConsole = new VirtualConsole();
virtualConsole.on("jsdomError", (e) => jsdomErrors.push(e));
const { window } = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true, virtualConsole });
for (const k of ["window", "document", "requestAnimationFrame", "cancelAnimationFrame", "getComputedStyle",
  "DOMParser", "Event", "KeyboardEvent", "MouseEvent"]) globalThis[k] = window[k];
if (!globalThis.navigator) globalThis.navigator = window.navigator; // Node 20 has none
// jsdom lays nothing out: the tree shows 20 rows; canvases record what is drawn
Object.defineProperty(window.HTMLElement.prototype, "clientHeight", {
  configurable: true, get() { return this.classList.contains("yax-tree") ? 20 * 22 : 0; },
});
window.HTMLCanvasElement.prototype.getContext = function getContext() {
  const canvas = this;
  canvas.drawn = { rects: 0, image: null };
  return {
    fillStyle: "",
    fillRect() { canvas.drawn.rects += 1; },
    createImageData: (w, h) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }),
    putImageData(img) { canvas.drawn.image = img; },
  };
};

// -- a model ------------------------------------------------------------------------------
/** `fold`: with structure keys, as Python sends them (the blocks alike, so that 3 or more fold). */
function transformerRows(layers, offset = 0, fold = false) {
  const rows = [callRow({ id: offset, parent: -1, name: "Transformer", type: "Transformer", ins: "i32[2,16]",
    outs: "f32[2,16,64]", params: 1234567, neq: 2 })];
  let id = offset + 1;
  for (let l = 0; l < layers; l++) {
    const block = id++;
    rows.push(callRow({ id: block, parent: offset, name: `Block_${l}`, type: "Block", params: 50000, neq: 1,
      fold: fold ? 1 : null }));
    for (const [k, [name, type]] of [["attn", "MultiHeadAttention"], ["Dense_0", "Dense"], ["gelu", "gelu"],
      ["Dense_1", "Dense"]].entries()) {
      const dense = type === "Dense";
      rows.push(callRow({ id: id++, parent: block, kind: type === "gelu" ? "activation" : "module_call", name, type,
        attrs: dense ? "features=64" : "", fields: dense ? "features=64 use_bias=True" : "",
        ins: "f32[2,16,64]", outs: "f32[2,16,64]", params: type === "gelu" ? 0 : 4160, neq: 3, fold: fold ? 2 + k : null }));
    }
  }
  return rows;
}

const floats32 = (n, f) => new DataView(Float32Array.from({ length: n }, (_, i) => f(i)).buffer);

/** The explorer's traits for a Transformer of `layers` blocks, before any change. */
function initialState(layers = 2) {
  const rows = transformerRows(layers);
  return {
    _tree: treeTrait(rows), _original_tree: treeTrait(rows), _query: "", _query_error: "",
    _matches: [], _match_owners: {},
    _palette: [{ name: "identity", kind: "function", doc: "x -> x" }, { name: "relu", kind: "function", doc: "" },
      { name: "LoRA r=4", kind: "module", doc: "" }],
    _history: { items: [], index: 0 }, _diff: { original: {}, current: {} }, _comparison: {},
    _status: { busy: false, message: "" }, _query_result: {},
  };
}

/** The equations of call `id` as `expand` lists them. */
const equationsOf = (id) => [
  equationRow({ id: 10000 + id, primitive: "dot_general", ins: "f32[2,16,64] f32[64,64]", outs: "f32[2,16,64]" }),
  equationRow({ id: 20000 + id, primitive: "add", ins: "f32[2,16,64]", outs: "f32[2,16,64]" })];

/** Answers like Python's: `handlers[type](msg, model)` returns the reply's payload (a
 * Promise for a slow one; `undefined`: no reply at all, as from a busy kernel). */
const PYTHON = {
  query(msg, model) {
    if (msg.xpath.includes("[")) { // refused: no trait changes, the reply says why
      return { type: "error", message: "Invalid XPath: unbalanced `[`." };
    }
    const calls = treeRecords(model.get("_tree"));
    const ids = msg.xpath ? calls.filter((c) => c.type === "Dense").map((c) => c.id) : [];
    model.set("_query", msg.xpath); // as the session does: the query that ran
    model.set("_query_error", "");
    model.set("_match_owners", {});
    model.set("_matches", ids);
    model.set("_query_result", msg.xpath.trim() ? { kind: "nodes", count: ids.length } : {});
    return { type: "ok", count: ids.length };
  },
  expand: (msg) => ({ type: "ok", id: msg.id, columns: [...FIXTURE_EQUATION_COLUMNS], rows: equationsOf(msg.id) }),
  equations: (msg) => ({ type: "ok", columns: [...FIXTURE_EQUATION_COLUMNS],
    calls: msg.ids.map((id) => [id, equationsOf(id)]) }),
  fits: () => ({ type: "ok", fits: ["identity", "relu"], refused: { "LoRA r=4": "`LoRA` replaces a Dense layer." } }),
  code: () => ({ type: "ok", code: "mox = yax.sub('//gelu', jax.nn.relu, mox)" }),
  graph: () => ({ type: "ok", dot: 'digraph { rankdir=LR; n1 [id="yax-3", label="Dense"]; x -> n1 -> y }' }),
};

class FakeModel {
  constructor(state, handlers) {
    this.state = state;
    this.handlers = { ...PYTHON, ...handlers };
    this.listeners = new Map();
    this.sent = [];
    this.saved = 0;
  }

  get(key) { return this.state[key]; }
  set(key, value) { this.state[key] = value; this.emit(`change:${key}`); }
  save_changes() { this.saved += 1; } // the front-end writing a synced trait: never (see afterEach)
  on(name, f) { this.listeners.set(name, [...(this.listeners.get(name) || []), f]); }
  off(name, f) { this.listeners.set(name, (this.listeners.get(name) || []).filter((g) => g !== f)); }
  emit(name, ...args) { for (const f of this.listeners.get(name) || []) f(...args); }
  listening() { return [...this.listeners.values()].reduce((n, fs) => n + fs.length, 0); }

  send(msg) {
    this.sent.push(msg);
    const handler = this.handlers[msg.type];
    setTimeout(async () => { // the kernel answers later, traits before the reply
      const payload = handler && (await handler(msg, this));
      if (payload) this.emit("msg:custom", { ...payload, rid: msg.rid }, []);
    }, 1);
  }

  /** The requests of a type sent so far, without their rids. */
  requests(type) { return this.sent.filter((m) => m.type === type).map(({ rid, ...rest }) => rest); }
}

// -- helpers ------------------------------------------------------------------------------
async function until(cond, what, ms = 3000) {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}
const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));

function key(el, k) { el.dispatchEvent(new window.KeyboardEvent("keydown", { key: k, bubbles: true })); }
function click(el) { el.dispatchEvent(new window.MouseEvent("click", { bubbles: true })); }
function drop(el, name) {
  const e = new window.Event("drop", { bubbles: true, cancelable: true });
  e.dataTransfer = { getData: () => name, dropEffect: "" };
  el.dispatchEvent(e);
}

// -- the tests ------------------------------------------------------------------------------
/** Show `widget` with a fake model; `timeoutMs` is the requests' limit. */
async function show(widget, { layers = 2, state = {}, handlers = {}, timeoutMs } = {}) {
  const model = new FakeModel({ ...initialState(layers), ...state }, handlers);
  const el = document.createElement("div");
  document.body.append(el);
  const cleanup = widget.render({ model, el, ...(timeoutMs ? { timeoutMs } : {}) });
  const root = el.querySelector(".yax-explorer");
  await until(() => root.dataset.ready === "1", "the first paint");
  const $ = (s) => root.querySelector(s);
  const $$ = (s) => [...root.querySelectorAll(s)];
  const names = () => $$(".yax-row .yax-name").map((e) => e.textContent);
  const row = (id) => $(`.yax-row[data-id="${id}"]`);
  return { model, root, cleanup, $, $$, names, row, status: () => $(".yax-status") };
}

/** The scenarios, each run on the source and on the bundle: `fn(mount)`, `mount(options)`
 * shows the widget (see `show`). */
const SCENARIOS = [];
const scenario = (name, fn) => SCENARIOS.push([name, fn]);

scenario("rows come from the `_tree` trait, the top two levels expanded", async (mount) => {
  const { root, $$, names, row } = await mount();
  assert.deepEqual(names(), ["Transformer", "Block_0", "attn", "Dense_0", "gelu", "Dense_1",
    "Block_1", "attn", "Dense_0", "gelu", "Dense_1"]);
  assert.ok(Number(root.dataset.paintMs) >= 0);
  const dense = row(3);
  assert.equal(dense.querySelector(".yax-type").textContent, "Dense");
  assert.equal(dense.querySelector(".yax-attrs").textContent, "features=64");
  assert.equal(dense.querySelector(".yax-shapes").textContent, "f32[2,16,64] → f32[2,16,64]");
  assert.equal(dense.querySelector(".yax-params").textContent, "4.2k");
  assert.equal(dense.title, "Dense(features=64 use_bias=True)");
  assert.equal(dense.style.top, "66px");
  assert.ok(row(4).classList.contains("yax-activation"));
  assert.equal(row(4).querySelector(".yax-type"), null); // type equal to the name: not repeated
  assert.equal(row(0).querySelector(".yax-params").textContent, "1.2M");
  assert.deepEqual($$(".yax-palette-item").map((e) => [e.dataset.name, e.draggable]),
    [["identity", true], ["relu", true], ["LoRA r=4", true]]);
  assert.equal($$(".yax-toggle:not(.yax-leaf)").length, 11); // every call here runs equations
});

scenario("only the rows in sight are in the DOM, and scrolling moves them", async (mount) => {
  const { $, $$ } = await mount({ layers: 48 }); // 241 rows, all expanded
  assert.equal($(".yax-spacer").style.height, `${241 * 22}px`);
  assert.equal($$(".yax-row").length, 30); // 20 in sight + 10 below
  const tree = $(".yax-tree");
  tree.scrollTop = 100 * 22;
  tree.dispatchEvent(new window.Event("scroll"));
  await frame();
  const tops = $$(".yax-row").map((e) => parseInt(e.style.top, 10) / 22);
  assert.deepEqual([tops[0], tops.at(-1), tops.length], [90, 129, 40]);
});

scenario("a scroll keeps the elements of the rows still in sight; any other change paints them anew", async (mount) => {
  const { model, root, $, $$ } = await mount({ layers: 48 });
  const tree = $(".yax-tree");
  const before = new Map($$(".yax-row").map((e) => [e.style.top, e]));
  tree.scrollTop = 5 * 22;
  tree.dispatchEvent(new window.Event("scroll"));
  await frame();
  const after = $$(".yax-row");
  assert.equal(after.length, 35); // rows 0 to 34: 20 in sight, 10 below, the 5 above still within 10
  assert.equal(after.filter((e) => before.get(e.style.top) === e).length, 30); // only rows 30 to 34 are new
  model.set("_matches", [3]);
  await until(() => root.dataset.matchIds === "3", "the highlight");
  assert.equal($$(".yax-row").filter((e) => before.get(e.style.top) === e).length, 0);
  assert.ok($('.yax-row[data-id="3"]').classList.contains("yax-match"));
});

scenario("typing a query sends it; the reply's highlight and count are shown", async (mount) => {
  const { model, root, $, $$ } = await mount();
  const input = $(".yax-query input");
  input.value = "//Dense";
  input.dispatchEvent(new window.Event("input"));
  await until(() => root.dataset.matchIds, "the highlight");
  assert.deepEqual(model.requests("query"), [{ type: "query", xpath: "//Dense" }]);
  assert.equal(root.dataset.matchIds, "3,5,8,10");
  assert.deepEqual($$(".yax-row.yax-match").map((e) => e.dataset.id), ["3", "5", "8", "10"]);
  await until(() => $(".yax-count").textContent === "4 matches", "the count");
  assert.equal($(".yax-status").textContent, "");
});

scenario("an invalid query's message is shown at the query box, not twice", async (mount) => {
  const { root, $ } = await mount();
  const input = $(".yax-query input");
  input.value = "//Dense[";
  input.dispatchEvent(new window.Event("input"));
  await until(() => $(".yax-query-error").textContent, "the query error");
  assert.match($(".yax-query-error").textContent, /unbalanced/);
  assert.ok(input.classList.contains("yax-invalid"));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal($(".yax-status").textContent, "");
  assert.equal(root.dataset.matchIds, "");
});

scenario("a refused query leaves the highlight of the query that ran, and says so", async (mount) => {
  const { root, $ } = await mount();
  const input = $(".yax-query input");
  input.value = "//Dense";
  input.dispatchEvent(new window.Event("input"));
  await until(() => root.dataset.matchIds === "3,5,8,10", "the highlight");
  window.document.body.focus();
  input.value = "//Dense[";
  input.dispatchEvent(new window.Event("input"));
  await until(() => $(".yax-query-error").textContent, "the query error");
  assert.match($(".yax-query-error").textContent, /unbalanced[^]*still shows the last query that ran: \/\/Dense$/);
  assert.equal(root.dataset.matchIds, "3,5,8,10"); // Python changed nothing
  input.value = "//Dense";
  input.dispatchEvent(new window.Event("input"));
  await until(() => !$(".yax-query-error").textContent, "the error gone once a query runs");
});

scenario("matched equations: their call's equations are loaded and the rows highlighted", async (mount) => {
  const { model, root, row } = await mount();
  model.set("_match_owners", { 10003: 3 });
  model.set("_matches", [10003]);
  await until(() => root.dataset.matchIds === "10003", "the equation highlight");
  assert.deepEqual(model.requests("expand"), [{ type: "expand", id: 3 }]);
  const eq = row(10003);
  assert.deepEqual([...eq.classList], ["yax-row", "yax-eq", "yax-match"]);
  assert.equal(eq.querySelector(".yax-name").textContent, "dot_general");
  assert.ok(row(20003)); // the call's other equation
});

scenario("rows read by the names their `columns` give; rows without `columns` are refused in words", async (mount) => {
  // the same rows with the columns in another order: the same tree
  const { model, $, names, row, status } = await mount({ handlers: {
    expand: (msg) => ({ type: "ok", id: msg.id, rows: equationsOf(msg.id) }), // no `columns`
  } });
  const before = names();
  const columns = [...FIXTURE_CALL_COLUMNS].reverse();
  const rows = model.get("_tree").rows.map((r) => columns.map((c) => r[FIXTURE_CALL_COLUMNS.indexOf(c)]));
  model.set("_tree", { version: 1, columns, rows });
  await frame();
  assert.deepEqual(names(), before);
  assert.equal(row(3).querySelector(".yax-attrs").textContent, "features=64");
  // an `expand` reply without them: the failure is shown, no equation is made up
  click(row(3).querySelector(".yax-toggle"));
  await until(() => status().classList.contains("yax-failed"), "the failure");
  assert.match(status().textContent, /The equations' rows came without `columns`/);
  assert.equal(row(10003), null);
  // a `_tree` without them: no rows, and the tree says why
  model.set("_tree", { version: 2, rows });
  await frame();
  assert.deepEqual(names(), []);
  assert.match($(".yax-empty.yax-error").textContent, /The tree's rows came without `columns`.*restart the kernel/);
  assert.match(status().textContent, /The tree's rows came without `columns`/);
  model.set("_tree", treeTrait(transformerRows(2), 3)); // rows that can be read again: the tree, no sentence
  await frame();
  assert.deepEqual(names(), before);
  assert.equal($(".yax-empty"), null);
});

scenario("a request with no reply is rejected after the timeout: the status says so", async (mount) => {
  const { model, $, status } = await mount({ timeoutMs: 40, state: { _status: { busy: false, message: "ready" } },
    handlers: { code: () => undefined, undo: () => ({ type: "ok" }) } });
  assert.equal(status().textContent, "ready");
  click($(".yax-copy"));
  await until(() => status().classList.contains("yax-failed"), "the failure");
  assert.match(status().textContent, /No reply from the kernel to `code` within 40 ms/);
  // a late reply changes nothing; the next request that succeeds clears the failure
  model.emit("msg:custom", { type: "ok", rid: model.sent.at(-1).rid, code: "late" }, []);
  assert.equal($(".yax-code"), null);
  model.set("_history", { items: ["x"], index: 1 });
  click($(".yax-undo"));
  await until(() => !status().classList.contains("yax-failed"), "the failure to clear");
  assert.equal(status().textContent, "ready");
});

scenario("error replies: the status shows the kernel's message; a refusal shows at its row", async (mount) => {
  const { model, $, row, status } = await mount({ state: { _history: { items: ["x"], index: 1 } }, handlers: {
    undo: () => ({ type: "error", message: "The request failed with RuntimeError: boom." }),
    substitute: () => ({ type: "error", message: "`relu` does not fit `Dense_0`." }), // no trait changes
  } });
  click($(".yax-undo"));
  await until(() => status().textContent.includes("boom"), "the undo failure");
  assert.ok(status().classList.contains("yax-failed"));
  drop(row(3), "relu");
  await until(() => $(".yax-notice"), "the notice");
  assert.deepEqual(model.requests("substitute"), [{ type: "substitute", target: 3, name: "relu" }]);
  assert.match($(".yax-notice").textContent, /does not fit/);
  assert.equal($(".yax-notice").style.top, `${4 * 22}px`); // below its row
  model.set("_status", { busy: false, message: "compared in 0.20 s" }); // the kernel's news replaces it
  assert.equal(status().textContent, "compared in 0.20 s");
  // a press on the notice itself keeps it; the next action anywhere else closes it
  $(".yax-notice").dispatchEvent(new window.MouseEvent("pointerdown", { bubbles: true }));
  await frame();
  assert.ok($(".yax-notice"));
  const pressed = row(2); // a press on a row closes it and keeps the row's element: the click that follows lands
  pressed.querySelector(".yax-name").dispatchEvent(new window.MouseEvent("pointerdown", { bubbles: true }));
  await frame();
  assert.equal($(".yax-notice"), null);
  assert.equal(row(2), pressed);
  drop(row(3), "relu");
  await until(() => $(".yax-notice"), "the notice again");
  $(".yax-tree").dispatchEvent(new window.KeyboardEvent("keydown", { key: "ArrowDown", bubbles: true }));
  await frame();
  assert.equal($(".yax-notice"), null);
});

scenario("undo and redo send their requests; the buttons and the history follow `_history`", async (mount) => {
  const history = (index) => ({ items: ["replaced Block_0/gelu with relu"], index });
  const apply = (index) => (msg, m) => new Promise((resolve) => setTimeout(() => {
    m.set("_history", history(index));
    resolve({ type: "ok" });
  }, 60)); // longer than timeoutMs: a change's requests wait longer
  const { model, $, $$, status } = await mount({ timeoutMs: 30, state: { _history: history(1) },
    handlers: { undo: apply(0), redo: apply(1) } });
  const [undo, redo] = [$(".yax-undo"), $(".yax-redo")];
  assert.deepEqual([undo.disabled, redo.disabled], [false, true]);
  assert.deepEqual($$(".yax-history-item.yax-current").map((e) => e.textContent), ["replaced Block_0/gelu with relu"]);
  click(undo);
  await until(() => undo.disabled, "undo");
  assert.equal(redo.disabled, false);
  assert.deepEqual($$(".yax-history-item.yax-undone").map((e) => e.textContent), ["replaced Block_0/gelu with relu"]);
  assert.deepEqual($$(".yax-history-item.yax-current").map((e) => e.textContent), ["original"]);
  click(redo);
  await until(() => redo.disabled, "redo");
  assert.deepEqual(model.requests("undo").concat(model.requests("redo")), [{ type: "undo" }, { type: "redo" }]);
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(status().textContent, "");
});

scenario("no key typed in the explorer reaches the page (JupyterLab's `d d`); Ctrl+Z / Ctrl+Shift+Z undo and redo",
  async (mount) => {
    const history = (index) => ({ items: ["replaced Block_0/gelu with relu"], index });
    const apply = (index) => (msg, m) => { m.set("_history", history(index)); return { type: "ok" }; };
    const { model, root, $ } = await mount({ state: { _history: history(1) }, handlers: { undo: apply(0), redo: apply(1) } });
    const reached = [];
    const listen = (e) => reached.push(`${e.type} ${e.key}`);
    for (const t of ["keydown", "keyup", "keypress"]) document.addEventListener(t, listen);
    try {
      assert.equal(root.getAttribute("data-lm-suppress-shortcuts"), "true");
      const press = (el, k, mods = {}) => {
        const down = new window.KeyboardEvent("keydown", { key: k, bubbles: true, cancelable: true, ...mods });
        el.dispatchEvent(down);
        el.dispatchEvent(new window.KeyboardEvent("keyup", { key: k, bubbles: true, ...mods }));
        return down;
      };
      for (const k of ["d", "d", "m", "a", "b", "z", "Enter", "Escape"]) press($(".yax-tree"), k);
      assert.deepEqual(reached, []);
      assert.ok(press($(".yax-tree"), "z", { ctrlKey: true }).defaultPrevented); // not the browser's nor the notebook's
      await until(() => $(".yax-undo").disabled, "Ctrl+Z undoes");
      press($(".yax-tree"), "z", { metaKey: true, shiftKey: true });
      await until(() => $(".yax-redo").disabled, "Cmd+Shift+Z redoes");
      // in the query box Ctrl+Z edits the text: no request
      assert.ok(!press($(".yax-query input"), "z", { ctrlKey: true }).defaultPrevented);
      assert.deepEqual(model.requests("undo").concat(model.requests("redo")), [{ type: "undo" }, { type: "redo" }]);
      assert.deepEqual(reached, []);
    } finally {
      for (const t of ["keydown", "keyup", "keypress"]) document.removeEventListener(t, listen);
    }
  });

scenario("a gradient colouring marks, visibly, each row whose gradient holds NaN or Inf", async (mount) => {
  const { model, row, $ } = await mount();
  $("select.yax-colour").value = "grad"; // what the user chose: the kernel's reply paints it
  const scalar = { name: "logits", index: null, chosen: 7, label: "d logits / d output", what: "logits", value: 1 };
  model.set("_overlay", { stat: "grad", label: "gradient norm", batch: "example", rows: 11, lo: 1, hi: 4,
    values: { 0: 4, 3: 2, 4: null }, why: { 3: "5 NaN or Inf in its gradient left out",
      4: "every value of its gradient is NaN or Inf" }, nonfinite: { 3: 5, 4: 512 }, scalar });
  await frame();
  assert.equal(row(3).querySelector(".yax-ov-nan").textContent, "NaN");
  assert.match(row(3).querySelector(".yax-ov-nan").title, /^5 NaN or Inf in its gradient/);
  assert.equal(row(4).querySelector(".yax-ov-nan").title, "512 NaN or Inf in its gradient");
  assert.equal(row(0).querySelector(".yax-ov-nan"), null); // finite: no mark
});

scenario("the top row shows the inputs as passed, and sharded inputs and parameters show their specs", async (mount) => {
  const { model, row } = await mount();
  model.set("_batches", { names: ["example"], current: "example", inputs: [
    { name: "input_ids", type: "i32[2,16]", sharding: "P('data')" }, { name: "mask", type: "bool[2,16]", sharding: "" }] });
  await frame();
  assert.equal(row(0).querySelector(".yax-shapes").textContent, "i32[2,16] bool[2,16] → f32[2,16,64]");
  assert.match(row(0).title, /inputs as passed: input_ids i32\[2,16\] P\('data'\), mask bool\[2,16\]; the call receives i32\[2,16\]/);
  assert.equal(row(0).querySelector(".yax-sharding").textContent, "in P('data')");
  assert.equal(row(3).querySelector(".yax-shapes").textContent, "f32[2,16,64] → f32[2,16,64]"); // not the top row
  assert.equal(row(3).querySelector(".yax-sharding"), null);
  const rows = fixtureRecords(model.get("_tree").rows).map(callRow);
  rows[3] = callRow({ ...fixtureRecords([rows[3]])[0], sharding: "kernel=P(None,'model') bias=P('model')" });
  model.set("_tree", treeTrait(rows, 1));
  await frame();
  assert.equal(row(3).querySelector(".yax-sharding").textContent, "P(None,'model') P('model')");
});

scenario("a click selects a row; its replace button offers what fits; picking one substitutes it", async (mount) => {
  const { model, $, $$, row } = await mount({ handlers: { substitute: () => ({ type: "ok", description: "ok" }) } });
  $('.yax-tab[data-tab="History"]').dispatchEvent(new window.MouseEvent("click"));
  click(row(3).querySelector(".yax-name"));
  await frame();
  assert.ok(row(3).classList.contains("yax-selected"));
  assert.equal($(".yax-fits"), null); // selecting (to graph it, say) opens no menu
  assert.deepEqual(model.requests("fits"), []);
  click(row(3).querySelector(".yax-replace"));
  await until(() => $(".yax-fits"), "the fits menu");
  assert.ok(row(3).classList.contains("yax-selected"));
  assert.deepEqual(model.requests("fits"), [{ type: "fits", id: 3 }]);
  assert.deepEqual($$(".yax-fit").map((b) => [b.dataset.name, b.disabled]),
    [["identity", false], ["relu", false], ["LoRA r=4", true]]);
  assert.equal($('.yax-fit[data-name="LoRA r=4"]').title, "`LoRA` replaces a Dense layer.");
  click($('.yax-fit[data-name="relu"]'));
  await until(() => model.requests("substitute").length, "the substitution");
  assert.deepEqual(model.requests("substitute"), [{ type: "substitute", target: 3, name: "relu" }]);
  await frame();
  assert.equal($(".yax-fits"), null);
  await until(() => $(".yax-tab.yax-active").dataset.tab === "Compare", "the compare tab");
  drop($(".yax-query"), "identity"); // onto the query box: every match
  await until(() => model.requests("substitute").length === 2, "the query substitution");
  // with the text the box shows, which Python checks is the query it ran
  assert.deepEqual(model.requests("substitute")[1], { type: "substitute", target: "query", name: "identity", xpath: "" });
});

scenario("the keyboard moves the selection, expands, collapses, offers and closes the menu", async (mount) => {
  const { model, $, names } = await mount();
  const tree = $(".yax-tree");
  const selected = () => $(".yax-row.yax-selected .yax-name")?.textContent;
  key(tree, "ArrowDown");
  key(tree, "ArrowDown");
  await frame();
  assert.equal(selected(), "Block_0");
  key(tree, "ArrowLeft"); // collapse
  await frame();
  assert.deepEqual(names(), ["Transformer", "Block_0", "Block_1", "attn", "Dense_0", "gelu", "Dense_1"]);
  key(tree, "ArrowLeft"); // to the parent
  await frame();
  assert.equal(selected(), "Transformer");
  key(tree, "ArrowDown");
  key(tree, "ArrowRight"); // expand again: its equation loads too
  await until(() => names().includes("dot_general"), "the block's equations");
  assert.deepEqual(model.requests("expand"), [{ type: "expand", id: 1 }]);
  key(tree, "Enter");
  await until(() => $(".yax-fits"), "the fits menu");
  key(tree, "Escape");
  await frame();
  assert.equal($(".yax-fits"), null);
});

scenario("a new `_tree` keeps what was open by path; the filter keeps matches and ancestors", async (mount) => {
  const { model, $, names, row } = await mount();
  click(row(6).querySelector(".yax-toggle")); // collapse Block_1
  await frame();
  model.set("_tree", treeTrait(transformerRows(2, 100), 1)); // every id changes
  await frame();
  assert.deepEqual(names(), ["Transformer", "Block_0", "attn", "Dense_0", "gelu", "Dense_1", "Block_1"]);
  assert.ok(row(103));
  const search = $(".yax-search input");
  search.value = "GELU";
  search.dispatchEvent(new window.Event("input"));
  await frame();
  assert.deepEqual(names(), ["Transformer", "Block_0", "gelu", "Block_1", "gelu"]);
});

scenario("undo and redo keep the selected row where it still exists, and its panes follow it", async (mount) => {
  const { model, $, row } = await mount({ handlers: {
    values: (msg, m) => { m.set("_values", { id: msg.id, key: `row ${msg.id}`, batch: "example", seconds: 0.1, more: 0,
      outputs: [] }); return { type: "ok", id: msg.id, seconds: 0.1 }; } } });
  click(row(8).querySelector(".yax-name")); // Block_1/Dense_0
  click($('.yax-tab[data-tab="Values"]'));
  await until(() => $(".yax-values-head code")?.textContent === "row 8", "the row's values");
  // undo: every id changes (a change elsewhere renumbers the rows); the same call is still there
  model.set("_tree", treeTrait(transformerRows(2, 100), 0));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "108");
  assert.ok(row(108).querySelector(".yax-replace"));
  await until(() => $(".yax-values-head code")?.textContent === "row 108", "its values in the new model");
  assert.deepEqual(model.requests("values").map((r) => r.id), [8, 108]);
  // the Graph tab draws it too
  click($('.yax-tab[data-tab="Graph"]'));
  model.set("_tree", treeTrait(transformerRows(2, 200), 1));
  await until(() => model.requests("graph").length === 2, "the graph of the kept row");
  assert.deepEqual(model.requests("graph").map((r) => r.id), [108, 208]);
  // a model without that call: nothing is selected, and the Values tab says so
  model.set("_tree", treeTrait(transformerRows(1, 300), 2));
  await frame();
  assert.equal($(".yax-row.yax-selected"), null);
  click($('.yax-tab[data-tab="Values"]'));
  assert.match($(".yax-values").textContent, /Select a row/);
});

scenario("an undo or a redo keeps the selected row where it was on screen", async (mount) => {
  const { model, $ } = await mount({ layers: 48 }); // 241 rows
  const tree = $(".yax-tree");
  tree.scrollTop = 150 * 22;
  tree.dispatchEvent(new window.Event("scroll"));
  await frame();
  click($('.yax-row[data-id="153"] .yax-name'));
  await frame();
  const onScreen = () => parseInt($(".yax-row.yax-selected").style.top, 10) - tree.scrollTop;
  const before = onScreen();
  // the new model: every id changes, and two rows above the selection are gone (Block_0's MLP replaced)
  const rows = transformerRows(48, 1000).filter((r) => ![1004, 1005].includes(r[FIXTURE_CALL_COLUMNS.indexOf("id")]));
  model.set("_tree", treeTrait(rows, 1));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "1153");
  assert.equal(onScreen(), before);
});

scenario("a selected equation stays selected: its open call's equations load again", async (mount) => {
  const { model, $, row } = await mount();
  click(row(3).querySelector(".yax-toggle")); // Block_0/Dense_0's equations
  await until(() => row(20003), "the equations");
  click(row(20003).querySelector(".yax-name")); // its `add`
  model.set("_tree", treeTrait(transformerRows(2, 100), 1));
  await until(() => row(20103)?.classList.contains("yax-selected"), "the equation selected again");
  assert.deepEqual(model.requests("expand"), [{ type: "expand", id: 3 }, { type: "expand", id: 103 }]);
  assert.equal($$sel($), 1);
});

function $$sel($) { return $(".yax-tree").querySelectorAll(".yax-selected").length; }

scenario("a drop on the query box that fits some matches offers to replace just those", async (mount) => {
  const refusal = "LoRA r=4 fits 2 of the 4 matches of `//Dense`. The 2 `Dense` matches … are refused. "
    + "Nothing was changed.";
  const { model, root, $, $$ } = await mount({ handlers: { substitute: (msg, m) => {
    if (!msg.ids) return { type: "error", message: refusal, fits: [3, 8], matches: 4 };
    m.set("_history", { items: ["replaced Transformer/Block_0/Dense_0, Transformer/Block_1/Dense_0 with LoRA r=4"],
      index: 1 });
    return { type: "ok", description: "replaced" };
  } } });
  const input = $(".yax-query input");
  input.value = "//Dense";
  input.dispatchEvent(new window.Event("input"));
  await until(() => root.dataset.matchIds === "3,5,8,10", "the highlight");
  drop($(".yax-query"), "LoRA r=4");
  await until(() => $(".yax-notice .yax-offer-apply"), "the offer");
  assert.equal($(".yax-notice").textContent, `×${refusal}Replace just the 2 matches of 4 that fit`); // close, why, offer
  click($(".yax-offer-apply"));
  await until(() => model.requests("substitute").length === 2, "the substitution of those that fit");
  assert.deepEqual(model.requests("substitute"), [
    { type: "substitute", target: "query", name: "LoRA r=4", xpath: "//Dense" },
    { type: "substitute", target: "query", name: "LoRA r=4", xpath: "//Dense", ids: [3, 8] }]);
  await frame();
  assert.equal($(".yax-notice"), null);
  await until(() => $(".yax-tab.yax-active").dataset.tab === "Compare", "the compare tab");
  // an offer goes with the query it was made for, and with the rows
  drop($(".yax-query"), "LoRA r=4");
  await until(() => $(".yax-offer-apply"), "the offer again");
  model.set("_query", "//gelu");
  await frame();
  assert.equal($(".yax-notice"), null);
  assert.deepEqual($$(".yax-offer-apply"), []);
});

scenario("a refused drop on the query box that fits none of the matches offers nothing", async (mount) => {
  const { $ } = await mount({ handlers: { substitute: () => ({ type: "error",
    message: "`yax.LoRA` adapts linen's `Dense` layers, but … Nothing was changed." }) } });
  drop($(".yax-query"), "LoRA r=4");
  await until(() => $(".yax-notice"), "the notice");
  assert.match($(".yax-notice").textContent, /adapts linen's/);
  assert.equal($(".yax-offer-apply"), null);
});

scenario("a comparison fills the compare pane and colours the rows; the diff marks them", async (mount) => {
  const { model, $, $$, row } = await mount();
  model.set("_diff", { original: { 4: "changed" }, current: { 4: "changed" } });
  model.set("_comparison", {
    allclose: false, first_divergence: "Transformer/Block_0/gelu", first_divergence_id: 4, seconds: 0.42,
    outputs: [{ name: "out", shape: [2, 16, 64], max_abs: 0.31, mean_abs: 0.02, rel: 0.04, cosine: 0.998,
      allclose: false, hist: { counts: [1, 4, 20, 80, 0, 90, 15, 3], lo: -0.3, hi: 0.3 },
      heat: { label: "[0]", rows: 16, cols: 32, original: floats32(512, (i) => Math.sin(i / 9)),
        modified: floats32(512, (i) => Math.sin(i / 9) + 0.1), diff: floats32(512, () => 0.1) } }],
    boundaries: { 4: { rel: 0.04, max_abs: 0.31, allclose: false }, 3: { rel: 0, max_abs: 0, allclose: true } },
  });
  await frame();
  const pane = $(".yax-compare");
  assert.match(pane.querySelector(".yax-verdict").textContent, /outputs differ.*Transformer\/Block_0\/gelu.*0\.42 s/);
  assert.deepEqual($$(".yax-stats tr").at(1).textContent, "out0.3100.02000.04000.998✗");
  assert.equal(pane.querySelector(".yax-hist").drawn.rects, 8); // a bar per bin
  const heats = $$(".yax-heat");
  assert.equal(heats.length, 3);
  const img = heats[0].drawn.image;
  assert.deepEqual([img.width, img.height, img.data[3], img.data.at(-1)], [32, 16, 255, 255]);
  assert.match($$(".yax-heat-fig figcaption")[2].textContent, /\|difference\| \(max 0\.100\)/);
  assert.ok(row(4).querySelector(".yax-first"));
  assert.ok(row(4).classList.contains("yax-changed"));
  assert.match(row(4).title, /relative error 0\.0400/);
  assert.notEqual(row(4).style.borderLeftColor, "transparent");
  assert.notEqual(row(3).style.borderLeftColor, row(4).style.borderLeftColor); // same (green) vs differs
  assert.deepEqual($$(".yax-diff .yax-diff-row.yax-changed").map((e) => e.textContent), ["~ gelu", "~ gelu"]);
});

scenario("the graph button lays out the graph with Graphviz in the pane", async (mount) => {
  const { model, $, row } = await mount();
  click(row(3).querySelector(".yax-name"));
  click($(".yax-graph-button"));
  assert.equal($(".yax-tab.yax-active").dataset.tab, "Graph");
  await until(() => $(".yax-graph svg"), "the SVG", 20_000);
  assert.deepEqual(model.requests("graph"), [{ type: "graph", id: 3, depth: 1 }]);
  assert.equal($(".yax-graph svg").querySelectorAll("g.node").length, 3);
});

scenario("the Graph tab draws the selected call by itself; it zooms; a box selects its row", async (mount) => {
  const { model, $, row } = await mount();
  click(row(3).querySelector(".yax-name"));
  click($('.yax-tab[data-tab="Graph"]')); // no button needed
  await until(() => $(".yax-graph svg"), "the SVG", 20_000);
  assert.deepEqual(model.requests("graph"), [{ type: "graph", id: 3, depth: 1 }]);
  const scale = () => Number($(".yax-graph-view").dataset.scale);
  const s0 = scale();
  click($(".yax-zoom-in"));
  assert.ok(scale() > s0);
  click($(".yax-zoom-out"));
  assert.equal(scale().toFixed(3), s0.toFixed(3));
  $(".yax-graph-depth").value = "2";
  $(".yax-graph-depth").dispatchEvent(new window.Event("change"));
  await until(() => model.requests("graph").length === 2, "the deeper graph");
  assert.deepEqual(model.requests("graph")[1], { type: "graph", id: 3, depth: 2 });
  await until(() => $(".yax-graph svg g.node[data-row]"), "the deeper SVG", 20_000);
  // selecting another row while the graph is shown draws that one
  click(row(1).querySelector(".yax-name"));
  await until(() => model.requests("graph").length === 3, "the graph of the new selection");
  assert.equal(model.requests("graph")[2].id, 1);
  await until(() => $(".yax-graph svg g.node[data-row]"), "its SVG", 20_000);
  // a click on a box selects its row (the fake graph's box is row 3)
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "1");
  click($(".yax-graph svg g.node[data-row] text"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "3");
});

scenario("the Export button asks the kernel to write the model; the status says where", async (mount) => {
  const { model, $ } = await mount({ handlers: { export: (msg, m) => {
    m.set("_status", { busy: false, message: "exported to yax_model_step0.jax_exported (0.1 MiB)" });
    return { type: "ok", files: ["yax_model_step0.jax_exported"], bytes: [100] };
  } } });
  click($(".yax-export"));
  await until(() => model.requests("export").length, "the export request");
  assert.deepEqual(model.requests("export"), [{ type: "export" }]);
  await until(() => $(".yax-status").textContent.includes("exported to"), "the status");
});

scenario("history items go to their state; the compare pane compares with the step before on request", async (mount) => {
  const { model, $, $$ } = await mount({ handlers: { goto: () => ({ type: "ok" }), compare_base: () => ({ type: "ok" }) } });
  model.set("_history", { items: ["replaced gelu with relu", "replaced relu with tanh"], index: 2 });
  click($('.yax-tab[data-tab="History"]'));
  assert.deepEqual($$(".yax-history-item").map((e) => e.dataset.index), ["0", "1", "2"]);
  click($('.yax-history-item[data-index="2"]')); // the current one: nothing to do
  click($('.yax-history-item[data-index="1"]'));
  await until(() => model.requests("goto").length, "the goto request");
  assert.deepEqual(model.requests("goto"), [{ type: "goto", index: 1 }]);
  click($('.yax-tab[data-tab="Compare"]'));
  const select = $(".yax-compare-base");
  assert.equal(select.value, "original");
  select.value = "previous";
  select.dispatchEvent(new window.Event("change"));
  await until(() => model.requests("compare_base").length, "the compare_base request");
  assert.deepEqual(model.requests("compare_base"), [{ type: "compare_base", base: "previous" }]);
  model.set("_compare_base", "previous");
  model.set("_comparison", { allclose: false, first_divergence: "Transformer/Block_0/gelu", first_divergence_id: 4,
    seconds: 0.1, rtol: 1e-5, atol: 1e-6, base: "previous",
    outputs: [{ name: "out", shape: [4], max_abs: 1, mean_abs: 0.5, rel: 0.1, cosine: 0.9, allclose: false,
      hist: { counts: [1, 0, 3], lo: -1, hi: 1, n: 4, nonfinite: 0 }, heat: null }],
    boundaries: { 3: { rel: 0, max_abs: 0, allclose: true }, 4: { rel: 0.04, max_abs: 0.5, allclose: false } } });
  assert.match($(".yax-compare .yax-verdict").textContent, /differ from the previous step/);
  assert.equal($(".yax-compare-base").value, "previous");
  // the per-call table, in program order; a click selects the call's row
  assert.deepEqual($$(".yax-boundaries tr.yax-boundary").map((r) => r.dataset.id), ["3", "4"]);
  assert.equal($(".yax-boundaries tr.yax-first-row").dataset.id, "4");
  click($(".yax-boundaries tr.yax-first-row"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "4");
  // the histogram's axis: its real ends and 0
  assert.deepEqual($$(".yax-hist-axis .yax-tick").map((t) => t.textContent), ["-1.00", "1.00", "0"]);
});

scenario("while a change compiles the compare pane says so; back at the original it says that", async (mount) => {
  const { model, $ } = await mount();
  const pane = () => $(".yax-compare");
  assert.match(pane().textContent, /Drag a replacement/);
  model.set("_status", { busy: true, message: "compiling and comparing…" });
  assert.match(pane().textContent, /Compiling and comparing the modified model/);
  model.set("_history", { items: ["replaced gelu with relu"], index: 1 });
  model.set("_comparison", { allclose: true, first_divergence: null, seconds: 0.1, rtol: 1e-5, atol: 1e-6,
    outputs: [{ name: "out", shape: [4], max_abs: 0, mean_abs: 0, rel: 0, cosine: 1, allclose: true,
      hist: { counts: [0, 4, 0], lo: 0, hi: 0, n: 4, nonfinite: 0 },
      heat: { label: "out", rows: 1, cols: 4, step: [1, 1], whole: true, original: floats32(4, () => 1),
        modified: floats32(4, () => 1), diff: floats32(4, () => 0) } }], boundaries: {} });
  model.set("_status", { busy: false, message: "compared in 0.10 s" });
  assert.ok(!pane().classList.contains("yax-stale"));
  assert.match(pane().querySelector(".yax-hist-fig").textContent, /every difference is 0, unchanged/);
  assert.doesNotMatch(pane().textContent, /0\.500/); // no range was made up
  assert.match($$heat(pane())[2], /\|difference\| \(max 0\)/);
  // a second change: the previous comparison stays, marked stale, under "compiling"
  model.set("_status", { busy: true, message: "compiling and comparing…" });
  assert.ok(pane().classList.contains("yax-stale"));
  assert.match(pane().firstChild.textContent, /Compiling and comparing/);
  // undone to the original: no stale comparison, no stale "compared in"
  model.set("_history", { items: ["replaced gelu with relu"], index: 0 });
  model.set("_comparison", {});
  model.set("_status", { busy: false, message: "" });
  assert.match(pane().textContent, /Back at the original model/);
  assert.equal($(".yax-status").textContent, "");
});

function $$heat(pane) { return [...pane.querySelectorAll(".yax-heat-fig figcaption")].map((e) => e.textContent); }

scenario("the code pane follows the history once shown; Copy as code says whether it copied", async (mount) => {
  let n = 0;
  const { model, $ } = await mount({ handlers: { code: () => ({ type: "ok", code: n ? `# change ${n}` : "# no changes" }) } });
  click($(".yax-copy"));
  await until(() => $(".yax-code"), "the code");
  assert.match($(".yax-copied").textContent, /Copied to the clipboard|clipboard is not available/);
  n = 1;
  model.set("_history", { items: ["a"], index: 1 });
  await until(() => $(".yax-code").textContent === "# change 1", "the code after a change");
  n = 0;
  model.set("_history", { items: ["a"], index: 0 }); // undone: the pane no longer shows the undone call
  await until(() => $(".yax-code").textContent === "# no changes", "the code after undo");
});

scenario("the count follows `_query_result`: a value, strings, an empty result with its explanation", async (mount) => {
  const { model, $ } = await mount();
  model.set("_query_result", { kind: "value", value: 51 });
  assert.equal($(".yax-count").textContent, "= 51");
  model.set("_query_result", { kind: "values", count: 3, values: ["a", "b", "c"] });
  assert.match($(".yax-count").textContent, /3 values/);
  model.set("_query_result", { kind: "nodes", count: 0, explain: "0  //x   <- stops matching here" });
  assert.equal($(".yax-count").textContent, "0 matches");
  assert.match($(".yax-query-explain").textContent, /stops matching here/);
  assert.notEqual($(".yax-query-explain").style.display, "none");
  model.set("_query_result", { kind: "nodes", count: 16 });
  assert.equal($(".yax-query-explain").style.display, "none");
  model.set("_matches", []); // the matches were all replaced: Python says 0 and the box follows
  model.set("_query_result", { kind: "nodes", count: 0 });
  assert.equal($(".yax-count").textContent, "0 matches");
});

scenario("next/previous match, only matches, expand and collapse all, filter by path", async (mount) => {
  const { model, $, $$, names } = await mount({ layers: 3 });
  model.set("_matches", [3, 8, 13]);
  await frame(); await frame();
  click($(".yax-next-match"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "3");
  assert.equal($(".yax-match-at").textContent, "1 of 3");
  click($(".yax-next-match"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "8");
  click($(".yax-prev-match")); click($(".yax-prev-match"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "13"); // wrapped around
  const only = $(".yax-only-matches");
  only.checked = true;
  only.dispatchEvent(new window.Event("change"));
  await frame();
  assert.deepEqual(names(), ["Transformer", "Block_0", "Dense_0", "Block_1", "Dense_0", "Block_2", "Dense_0"]);
  only.checked = false;
  only.dispatchEvent(new window.Event("change"));
  click($(".yax-collapse-all"));
  await frame();
  assert.deepEqual(names(), ["Transformer"]);
  click($(".yax-expand-all")); // every call, and their equations in one request
  await until(() => $(".yax-spacer").style.height === `${(16 + 2 * 16) * 22}px`, "every row and equation");
  assert.deepEqual(model.requests("equations"), [{ type: "equations", ids: [...Array(16).keys()] }]);
  assert.deepEqual(model.requests("expand"), []);
  const search = $(".yax-search input");
  search.value = "Block_1/gelu";
  search.dispatchEvent(new window.Event("input"));
  await frame();
  assert.deepEqual(names(), ["Transformer", "Block_1", "gelu"]);
  search.value = "layer/3/attention";
  search.dispatchEvent(new window.Event("input"));
  await frame();
  assert.match($(".yax-empty").textContent, /No row matches the filter “layer\/3\/attention”/);
});

// -- folding: 5 blocks alike (ids 1, 6, 11, 16, 21; in each: attn +1, Dense_0 +2, gelu +3, Dense_1 +4) ---------
const FOLDED = { layers: 5, state: { _tree: treeTrait(transformerRows(5, 0, true)) } };

scenario("blocks alike fold into one ×N row; it and its inside show the marks of all of them", async (mount) => {
  const { model, root, $, names, row } = await mount(FOLDED);
  assert.deepEqual(names(), ["Transformer", "Block_0 … Block_4", "attn", "Dense_0", "gelu", "Dense_1"]);
  const folded = row(1);
  assert.ok(folded.classList.contains("yax-folded"));
  assert.equal(folded.querySelector(".yax-fold").textContent, "×5");
  assert.match(folded.title, /5 calls alike, folded: Transformer\/Block_0 … Transformer\/Block_4/);
  assert.equal(folded.querySelector(".yax-params").textContent, "50.0k each");
  // a match in Block_3 only: the row standing for it is highlighted, and says how many of the 5 match
  model.set("_matches", [20]);
  await until(() => root.dataset.matchIds === "20", "the highlight");
  assert.ok(row(5).classList.contains("yax-match"));
  assert.equal(row(5).querySelector(".yax-fold-hits").textContent, "1 of 5 match");
  assert.ok(!row(3).classList.contains("yax-match"));
  // a diff mark and the divergence of Block_3, the first to diverge: on the folded row and its inside
  model.set("_diff", { original: {}, current: { 18: "changed" } });
  model.set("_comparison", { first_divergence_id: 16, boundaries: { 1: { rel: 1e-8, max_abs: 0 },
    16: { rel: 0.5, max_abs: 1 } } });
  await frame();
  assert.ok(row(3).classList.contains("yax-changed"));
  assert.equal(row(3).querySelector(".yax-fold-hits").textContent, "changed in 1 of 5");
  assert.match(row(1).querySelector(".yax-first").title, /Transformer\/Block_3, one of the 5 calls/);
  assert.match(row(1).title, /relative error 0.5.*the most diverging of 5/);
  // its ×5 unfolds it: each block on its row, Block_3 with its own marks
  click(row(1).querySelector(".yax-fold"));
  await frame();
  assert.deepEqual(names().slice(0, 8), ["Transformer", "Block_0", "attn", "Dense_0", "gelu", "Dense_1", "Block_1",
    "attn"]);
  assert.ok(row(16).querySelector(".yax-first") && !row(1).querySelector(".yax-first"));
  assert.equal($(".yax-fold-hits"), null);
  // "fold repeats" off and on again: every run folds again
  const fold = $(".yax-fold-repeats");
  assert.equal(fold.checked, true);
  fold.checked = false;
  fold.dispatchEvent(new window.Event("change"));
  fold.checked = true;
  fold.dispatchEvent(new window.Event("change"));
  await frame();
  assert.equal(names()[1], "Block_0 … Block_4");
});

scenario("a drop or a replacement on a folded row is refused at the row; Unfold shows the one call", async (mount) => {
  const { model, $, row } = await mount(FOLDED);
  drop(row(1), "relu");
  await until(() => $(".yax-notice"), "the notice");
  assert.match($(".yax-notice").textContent, /folded: it stands for the 5 calls alike Block_0 … Block_4/);
  assert.deepEqual(model.requests("substitute"), []);
  click($(".yax-offer-apply")); // Unfold
  await frame();
  assert.equal(row(6).querySelector(".yax-name").textContent, "Block_1");
  assert.equal($(".yax-row.yax-selected").dataset.id, "1");
  drop(row(1), "relu"); // now one call: taken
  await until(() => model.requests("substitute").length === 1, "the substitution");
  assert.deepEqual(model.requests("substitute"), [{ type: "substitute", target: 1, name: "relu" }]);
});

scenario("what fits a row inside a folded run: refused there, then offered for the one call", async (mount) => {
  const { model, $, row } = await mount(FOLDED);
  click(row(3).querySelector(".yax-name")); // Dense_0 inside the folded blocks
  await frame();
  assert.equal(row(3).querySelector(".yax-replace"), null); // no "replace…" on a row standing for 5
  key($(".yax-tree"), "Enter");
  await until(() => $(".yax-notice"), "the notice");
  assert.match($(".yax-notice").textContent, /one call in each of the 5 calls alike/);
  assert.deepEqual(model.requests("fits"), []);
  click($(".yax-offer-apply")); // Unfold, then choose
  await until(() => $(".yax-fits"), "the fits menu of Block_0/Dense_0");
  assert.deepEqual(model.requests("fits"), [{ type: "fits", id: 3 }]);
});

scenario("stepping to a match in a folded run unfolds it and selects the match itself", async (mount) => {
  const { model, $, names } = await mount(FOLDED);
  model.set("_matches", [20, 10]); // Block_3/Dense_1, Block_1/Dense_1
  await frame(); await frame();
  click($(".yax-next-match"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "10");
  assert.ok(names().includes("Block_3")); // the run is unfolded
  assert.equal($(".yax-match-at").textContent, "1 of 2");
  click($(".yax-next-match"));
  await frame();
  assert.equal($(".yax-row.yax-selected").dataset.id, "20");
});

scenario("a pick in the compare pane on a call hidden in a folded run unfolds it; on the first, it stays",
  async (mount) => {
    const { model, $, names } = await mount(FOLDED);
    model.set("_comparison", { allclose: false, first_divergence: "Transformer/Block_3/gelu", first_divergence_id: 19,
      seconds: 0.1, rtol: 1e-5, atol: 1e-6, outputs: [], boundaries: { 4: { rel: 0, max_abs: 0, allclose: true },
        19: { rel: 0.04, max_abs: 0.5, allclose: false } } });
    click($('.yax-boundaries tr.yax-boundary[data-id="4"]')); // Block_0/gelu: the folded row's inside shows it
    await frame();
    assert.equal($(".yax-row.yax-selected").dataset.id, "4");
    assert.equal(names()[1], "Block_0 … Block_4");
    click($('.yax-boundaries tr.yax-boundary[data-id="19"]')); // Block_3/gelu: hidden, so unfolded
    await frame();
    assert.equal($(".yax-row.yax-selected").dataset.id, "19");
    assert.ok(names().includes("Block_3") && !names().includes("Block_0 … Block_4"));
  });

scenario("expand all with blocks folded: every call's equations in one request, the folded ones' too",
  async (mount) => {
    const { model, $, names } = await mount(FOLDED);
    click($(".yax-expand-all"));
    await until(() => names().includes("dot_general"), "the equations");
    assert.deepEqual(model.requests("equations"), [{ type: "equations", ids: [...Array(26).keys()] }]);
    // 1 + 5 rows and their equations (the folded row's are its first block's), the blocks' and their equations
    assert.equal($(".yax-spacer").style.height, `${(6 + 2 * 6) * 22}px`);
    click($(".yax-fold"));
    await frame();
    assert.equal($(".yax-spacer").style.height, `${(26 + 2 * 26) * 22}px`);
  });

scenario("a sharded call's row says how its parameters are laid out in its tooltip", async (mount) => {
  const rows = transformerRows(1);
  rows[3] = callRow({ ...fixtureRecords([rows[3]])[0], sharding: "kernel=P(None,'model') bias=P()" });
  const { row } = await mount({ layers: 1, state: { _tree: treeTrait(rows), _original_tree: treeTrait(rows) } });
  assert.equal(row(3).title, "Dense(features=64 use_bias=True)\nsharding: kernel=P(None,'model') bias=P()");
  assert.equal(row(5).title, "Dense(features=64 use_bias=True)"); // nothing split: nothing said
});

scenario("the cleanup it returns stops listening to the model", async (mount) => {
  const { model, cleanup } = await mount();
  assert.ok(model.listening() > 10);
  cleanup();
  assert.equal(model.listening(), 0);
});

// -- on the source and on the bundle ---------------------------------------------------------
const TARGETS = [["source", new URL("../src/index.js", import.meta.url)],
  ["bundle", new URL("../../yax_widget/static/widget.js", import.meta.url)]];

for (const [label, url] of TARGETS) {
  describe(`render() from the ${label}`, { skip: !existsSync(url) && "no bundle: run `npm run build`" }, () => {
    let widget;
    const cleanups = [];
    const models = [];
    beforeEach(async () => {
      widget ??= (await import(url)).default;
      jsdomErrors.length = 0;
    });
    afterEach(() => {
      for (const f of cleanups.splice(0)) f();
      document.body.replaceChildren();
      assert.deepEqual(jsdomErrors.map(String), []);
      // synced state is Python's alone: the front-end keeps its own (selection, expansion, filter, a refused
      // query's message) apart and never saves a trait
      const mounted = models.splice(0);
      assert.deepEqual(mounted.map((m) => m.saved), mounted.map(() => 0));
    });
    const mount = async (options) => {
      const shown = await show(widget, options);
      cleanups.push(shown.cleanup);
      models.push(shown.model);
      return shown;
    };
    for (const [name, fn] of SCENARIOS) test(name, () => fn(mount));
  });
}
