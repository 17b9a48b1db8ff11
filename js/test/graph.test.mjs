// The graph pane's pure parts (the size guard, fitting, decorating Graphviz's SVG), its layout
// client (a worker, stopped when superseded or late; the main thread where none can start), and
// the pane in a DOM: folded and closed boxes open on a double-click, a click selects without
// drawing again, and a graph too large is not laid out but offered smaller.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";

const { window } = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true });
for (const k of ["window", "document", "DOMParser", "Event", "MouseEvent", "requestAnimationFrame"]) globalThis[k] = window[k];

const { decorate, fitView, graphSize, GUARD_WEIGHT, createGraphPane } = await import("../src/panes/graph.js");
const { createLayout, LayoutStopped } = await import("../src/panes/layout.js");

const until = async (f, what, ms = 20_000) => {
  const t0 = Date.now();
  while (!f()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
};

/** A `to_dot`-like graph: a chain of `n` boxes, each also fed by the input `n0` (as 80 layers each
 * take the mask): the edges from n0 cross ever more ranks. */
function fan(n) {
  const nodes = Array.from({ length: n + 1 }, (_, i) => `  n${i} [label="b${i}"];`);
  const edges = Array.from({ length: n }, (_, i) => [`  n${i} -> n${i + 1};`, i ? `  n0 -> n${i + 1};` : ""]).flat();
  return `digraph yax {\n${nodes.join("\n")}\n${edges.filter(Boolean).join("\n")}\n}\n`;
}

test("graphSize counts boxes, edges and the ranks long edges cross", () => {
  assert.deepEqual(graphSize(fan(2)), { nodes: 3, edges: 3, spans: 1, weight: 7 });
  assert.deepEqual(graphSize('digraph { n1 [id="yax-3", label="a -> b"]; }'), { nodes: 0, edges: 0, spans: 0, weight: 0 });
  // what the guard is for: 80 layers fed from the inputs weigh far more than their boxes
  const big = graphSize(fan(80));
  assert.equal(big.nodes, 81);
  assert.ok(big.weight > GUARD_WEIGHT && graphSize(fan(20)).weight < GUARD_WEIGHT, big);
});

test("fitView shows the whole drawing, never larger than life, centred across", () => {
  assert.deepEqual(fitView(400, 300, 200, 100), { x: 100, y: 8, s: 1 }); // small: actual size
  const tall = fitView(400, 300, 200, 2840);
  assert.equal(tall.s, (300 - 16) / 2840);
  assert.ok(tall.x + 200 * tall.s <= 400 && tall.y + 2840 * tall.s <= 300);
  const wide = fitView(400, 300, 3920, 100);
  assert.equal(wide.s, (400 - 16) / 3920);
  assert.equal(wide.x, 8);
  assert.equal(fitView(400, 300, 1e7, 1e7).s, 0.02);
  assert.deepEqual(fitView(400, 300, 0, 0), { x: 8, y: 8, s: 1 });
});

const SVG = `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="300pt" height="150pt">
<g id="graph0" class="graph">
<g id="yax-15" class="node yax-fold yax-more"><title>n8</title>
<g id="a_yax-15"><a xlink:title="80 identical calls, drawn once: m/layers/0 … m/layers/79">
<path d="M0,0"/><text>layers 0–79 ×80 : Layer</text></a></g></g>
<g id="yax-3" class="node"><title>n6</title><polygon points="0,0"/><text>embed : Embed</text><text>i32[1,8]</text></g>
<g id="yax-2" class="cluster"><title>cluster_5</title><polygon points="0,0"/><text>m/model : Model</text></g>
<g id="node1" class="node"><title>n1</title><polygon points="0,0"/><text>args[1]</text></g>
</g></svg>`;

test("decorate takes a fold's shapes out of Graphviz's tooltip link, names each box, marks rows", () => {
  const svg = new DOMParser().parseFromString(SVG, "image/svg+xml").documentElement;
  decorate(svg, { boundaries: { 3: { rel: 0.5 } }, marks: { 15: "changed" } }, new Set([2]));
  const fold = svg.querySelector('[id="yax-15"]');
  assert.equal(fold.querySelector("a"), null);
  assert.equal(fold.querySelector(":scope > path").getAttribute("d"), "M0,0"); // box > shape, as the CSS expects
  assert.equal(fold.querySelector("title").textContent,
    "80 identical calls, drawn once: m/layers/0 … m/layers/79\ndouble-click to open it");
  assert.ok(fold.classList.contains("yax-changed"));
  assert.equal(fold.dataset.row, "15");
  const embed = svg.querySelector('[id="yax-3"]');
  assert.equal(embed.querySelector("title").textContent, "embed : Embed\ni32[1,8]");
  assert.notEqual(embed.querySelector("polygon").getAttribute("stroke"), null); // its divergence colour
  assert.match(svg.querySelector('[id="yax-2"] title').textContent, /double-click to close it/); // opened here
  assert.equal(svg.querySelector('[id="node1"]').dataset.row, undefined); // an input is no row
  decorate(svg, { marks: {} }); // again, from a later diff: the mark goes, nothing breaks
  assert.ok(!fold.classList.contains("yax-changed"));
});

/** A stand-in for the page's Worker: records what it is sent; `answer` replies like the engine. */
class FakeWorker {
  static made = [];
  constructor(url, options) {
    Object.assign(this, { url, options, sent: [], terminated: false });
    FakeWorker.made.push(this);
  }
  postMessage(data) { this.sent.push(data); }
  terminate() { this.terminated = true; }
  answer(data) { this.onmessage({ data }); }
}

test("the layout runs in a worker; a newer layout or a late one stops it", async () => {
  FakeWorker.made = [];
  const layout = createLayout({ source: "export const layout = 0;", Worker: FakeWorker, timeoutMs: 50 });
  const first = layout.run("digraph { a }");
  const w = FakeWorker.made[0];
  assert.deepEqual(w.options, { type: "module" });
  w.answer({ ready: true });
  w.answer({ id: w.sent[0].id, svg: "<svg/>", ms: 3 });
  assert.deepEqual(await first, { svg: "<svg/>", ms: 3, worker: true });
  // a second layout while one runs ends that worker (Graphviz cannot be interrupted) and starts another
  const slow = layout.run("digraph { b }");
  const next = layout.run("digraph { c }");
  await assert.rejects(slow, (e) => e instanceof LayoutStopped && e.reason === "stopped");
  assert.ok(w.terminated);
  const w2 = FakeWorker.made[1];
  assert.equal(w2.sent[0].dot, "digraph { c }");
  // past its time it is stopped, and says so
  await assert.rejects(next, (e) => e instanceof LayoutStopped && e.reason === "timeout" && /longer than/.test(e.message));
  assert.ok(w2.terminated);
  // Graphviz's refusal comes back as an error
  const bad = layout.run("digraph {");
  FakeWorker.made[2].answer({ id: FakeWorker.made[2].sent[0].id, error: "syntax error in line 1" });
  await assert.rejects(bad, /syntax error/);
  layout.dispose();
});

test("where no worker can start, the main thread lays out", async () => {
  FakeWorker.made = [];
  const source = "export async function layout(dot) { return `<svg>${dot.length}</svg>`; }";
  const layout = createLayout({ source, Worker: FakeWorker });
  const done = layout.run("digraph { a }");
  FakeWorker.made[0].onerror({ message: "module workers are not supported" }); // before it said it was ready
  assert.deepEqual({ ...(await done), ms: 0 }, { svg: "<svg>13</svg>", ms: 0, worker: false });
  assert.equal((await layout.run("digraph {}")).worker, false); // and goes on doing so
  assert.equal(FakeWorker.made.length, 1);
  const none = createLayout({ source, Worker: undefined }); // no Worker at all (jsdom)
  assert.equal((await none.run("x")).svg, "<svg>1</svg>");
});

const FOLDED = `digraph yax {
  n1 [shape="box", label="args[1]"];
  subgraph cluster_2 { id="yax-1"; label="m : M";
    n3 [shape="box", class="yax-fold yax-more", tooltip="3 identical calls, drawn once: m/b_0 … m/b_2", id="yax-5", label="b_0–2 ×3 : B"];
    n4 [shape="box", class="yax-more", id="yax-40", label="head : Head"];
  }
  n1 -> n3; n3 -> n4;
}`;

function pane(reply) {
  const sent = [];
  const picks = [];
  const el = document.createElement("div");
  document.body.replaceChildren(el);
  const p = createGraphPane({ el, request: async (type, payload) => { sent.push(payload); return { dot: reply(payload) }; },
    onPick: (id) => { picks.push(id); p.show(id); } }); // as index.js: the selection asks the pane to draw it
  return { p, el, sent, picks, $: (s) => el.querySelector(s) };
}

const dblclick = (node) => node.dispatchEvent(new window.MouseEvent("dblclick", { bubbles: true }));
const click = (node) => node.dispatchEvent(new window.MouseEvent("click", { bubbles: true }));

test("a double-click opens a folded or closed box in place; a click selects its row and draws nothing new", async () => {
  const { p, sent, picks, $ } = pane(() => FOLDED);
  p.show(null);
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  assert.deepEqual(sent, [{ id: null, depth: 1 }]); // folded unless unticked: the kernel's default
  assert.equal($('g.node[data-row="5"] title').textContent,
    "3 identical calls, drawn once: m/b_0 … m/b_2\ndouble-click to open it");
  click($('g.node[data-row="5"] text'));
  assert.deepEqual(picks, [5]);
  assert.equal(sent.length, 1); // the row is selected; the graph stays
  assert.equal(p.current(), 5);
  assert.ok($('g.node[data-row="5"]').classList.contains("yax-picked"));
  dblclick($('g.node[data-row="5"] text'));
  await until(() => sent.length === 2, "the request opening the fold");
  assert.deepEqual(sent[1], { id: null, depth: 1, open: [5] });
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  dblclick($('g.node[data-row="40"] text'));
  await until(() => sent.length === 3, "the request opening the head too");
  assert.deepEqual(sent[2], { id: null, depth: 1, open: [5, 40] });
  // unticking fold asks for the layers one by one, the boxes opened staying open
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  const fold = $(".yax-graph-fold");
  fold.checked = false;
  fold.dispatchEvent(new window.Event("change"));
  await until(() => sent.length === 4, "the unfolded graph");
  assert.deepEqual(sent[3], { id: null, depth: 1, fold: false, open: [5, 40] });
  // another depth starts again with no box opened
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  $(".yax-graph-depth").value = "2";
  $(".yax-graph-depth").dispatchEvent(new window.Event("change"));
  await until(() => sent.length === 5, "the deeper graph");
  assert.deepEqual(sent[4], { id: null, depth: 2, fold: false });
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  assert.ok(Number($(".yax-graph-view").dataset.layoutMs) >= 0);
  p.dispose();
});

test("a graph too large to lay out quickly is not laid out: the pane says its size and offers less", async () => {
  const { p, sent, $ } = pane((payload) => (payload.depth >= 3 && payload.fold === false ? fan(80) : FOLDED));
  const fold = $(".yax-graph-fold");
  fold.checked = false;
  $(".yax-graph-depth").value = "3";
  p.show(null);
  await until(() => $(".yax-graph-view").dataset.state === "guard", "the guard");
  assert.match($(".yax-graph-guard").textContent, /81 boxes and 159 edges: Graphviz could take minutes/);
  assert.equal($(".yax-graph-stage svg"), null);
  assert.ok($(".yax-guard-anyway"));
  click($(".yax-guard-fold"));
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the folded graph");
  assert.deepEqual(sent.at(-1), { id: null, depth: 3 });
  assert.ok(fold.checked);
  fold.checked = false;
  fold.dispatchEvent(new window.Event("change"));
  await until(() => $(".yax-graph-view").dataset.state === "guard", "the guard again");
  click($(".yax-guard-depth"));
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the shallower graph");
  assert.deepEqual(sent.at(-1), { id: null, depth: 2, fold: false });
  assert.equal($(".yax-graph-depth").value, "2");
  p.dispose();
});

test("a refused request to open a box says why above the drawing, which stays", async () => {
  const { p, $ } = pane((payload) => {
    if (payload.open) throw new Error("This page is a snapshot: drawing this graph needs the live kernel.");
    return FOLDED;
  });
  p.show(3);
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the drawing");
  dblclick($('g.node[data-row="40"] text'));
  await until(() => $(".yax-graph-view").dataset.state === "error", "the refusal");
  assert.ok($(".yax-graph-stage svg g.node[data-row='40']")); // still drawn
  assert.ok(!$(".yax-graph-status").hidden);
  assert.match($(".yax-graph-state").textContent, /needs the live kernel/);
  // the next drawing clears the message
  p.show(7);
  await until(() => $(".yax-graph-view").dataset.state === "ready", "the other call");
  assert.ok($(".yax-graph-status").hidden);
  p.dispose();
});
