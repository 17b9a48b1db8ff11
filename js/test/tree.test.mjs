import assert from "node:assert/strict";
import { test } from "node:test";
import {
  allExpandable, ancestorsOf, buildTree, equationNodes, expandable, expandedByPath, filterKeep, foldName, foldRuns,
  foldsAround, initialExpanded, layout, matchKeep, ownerOf, pathOf, shownAs, visibleRows,
} from "../src/tree.js";
import { FIXTURE_EQUATION_COLUMNS, callRow, equationRow, fixtureRecords } from "../src/rows.js";

/** The tree of fixture rows (`callRow`'s), as the view builds it from a `_tree` trait. */
const build = (rows) => buildTree(fixtureRecords(rows));
/** The equation nodes of fixture rows (`equationRow`'s) under `parent`. */
const eqNodes = (parent, rows) => equationNodes(parent, FIXTURE_EQUATION_COLUMNS, rows);

const call = (id, parent, kind, name, type, attrs = "", params = 0, neq = 0, fields = "") =>
  callRow({ id, parent, kind, name, type, attrs, ins: "f32[2]", outs: "f32[2]", params, neq, fields });
const ROWS = [
  call(1, -1, "module_call", "Model", "Model", "", 30, 1),
  call(2, 1, "module_call", "Block_0", "Block", "", 20, 0),
  call(3, 2, "module_call", "Dense_0", "Dense", "features=2", 6, 2, "features=2 use_bias=True"),
  call(6, 2, "activation", "gelu", "gelu", "", 0, 3),
  call(7, 1, "module_call", "Block_1", "Block", "", 10, 0),
  call(8, 7, "module_call", "Dense_0", "Dense", "features=2", 6, 2),
];

test("buildTree links children in document order with depths", () => {
  const t = build(ROWS);
  assert.deepEqual(t.roots.map((n) => n.id), [1]);
  assert.deepEqual(t.byId.get(2).children.map((n) => n.id), [3, 6]);
  assert.deepEqual([...t.byId.values()].map((n) => n.depth), [0, 1, 2, 2, 1, 2]);
  assert.equal(t.byId.get(3).attrs, "features=2");
  assert.equal(t.byId.get(3).fields, "features=2 use_bias=True");
  assert.equal(t.byId.get(2).fields, "");
});

test("visibleRows follows the expanded set; equations in program order among the calls", () => {
  const t = build(ROWS);
  assert.deepEqual(visibleRows(t, new Set()).map((n) => n.id), [1]);
  assert.deepEqual(visibleRows(t, new Set([1])).map((n) => n.id), [1, 2, 7]);
  const eqs = new Map([[1, eqNodes(t.byId.get(1), [equationRow({ id: 100, primitive: "add" })])]]);
  assert.deepEqual(visibleRows(t, new Set([1, 2]), eqs).map((n) => n.id), [1, 2, 3, 6, 7, 100]);
  // ids are document order: an equation run between two calls is listed between them (GPT-2's
  // gelu equations sit between c_fc and c_proj, not after c_proj)
  const mid = new Map([[2, eqNodes(t.byId.get(2), [equationRow({ id: 5, primitive: "mul" }),
    equationRow({ id: 6.5, primitive: "add" })])]]);
  assert.deepEqual(visibleRows(t, new Set([1, 2]), mid).map((n) => n.id), [1, 2, 3, 5, 6, 6.5, 7]);
  const eq = eqs.get(1)[0];
  assert.equal(eq.depth, 1);
  assert.equal(eq.name, "add");
  assert.equal(expandable(eq), false);
  assert.equal(expandable(t.byId.get(6)), true); // an activation with equations
});

test("initialExpanded opens the top levels only", () => {
  const t = build(ROWS);
  assert.deepEqual([...initialExpanded(t, 2)].sort(), [1, 2, 7]);
  assert.deepEqual([...initialExpanded(t, 1)], [1]);
});

test("ancestorsOf collects every ancestor once, not the ids", () => {
  const t = build(ROWS);
  const up = ancestorsOf([3, 8, 6], (i) => t.byId.get(i)?.parent);
  assert.deepEqual([...up].sort(), [1, 2, 7]);
  assert.deepEqual([...ancestorsOf([1], (i) => t.byId.get(i)?.parent)], []);
});

test("filterKeep keeps matches and their ancestors; visibleRows shows them expanded", () => {
  const t = build(ROWS);
  assert.equal(filterKeep(t, "  "), null);
  const keep = filterKeep(t, "GELU");
  assert.deepEqual([...keep].sort(), [1, 2, 6]);
  assert.deepEqual(visibleRows(t, new Set(), new Map(), keep).map((n) => n.id), [1, 2, 6]);
  assert.deepEqual([...filterKeep(t, "dense")].sort(), [1, 2, 3, 7, 8]);
});

test("a fully expanded 48-layer tree (~1000 rows) is built and flattened quickly", () => {
  const rows = [callRow({ id: 0, parent: -1, name: "Model", type: "Model" })];
  let id = 1;
  for (let l = 0; l < 48; l++) {
    const b = id++;
    rows.push(callRow({ id: b, parent: 0, name: `Block_${l}`, type: "Block" }));
    for (let k = 0; k < 20; k++) rows.push(callRow({ id: id++, parent: b, name: `Dense_${k}`, type: "Dense", neq: 2 }));
  }
  const t0 = performance.now();
  const tree = build(rows);
  const all = new Set(tree.byId.keys());
  const visible = visibleRows(tree, all);
  const ms = performance.now() - t0;
  assert.equal(visible.length, rows.length);
  assert.equal(visible[2].depth, 2);
  assert.ok(ms < 100, `took ${ms} ms`);
  const keep = filterKeep(tree, "Block_47");
  const shown = visibleRows(tree, all, new Map(), keep);
  assert.equal(shown[0].name, "Model");
  assert.equal(shown[1].name, "Block_47");
});

test("ownerOf: a call is its own owner, an equation's comes from `_match_owners`", () => {
  const t = build(ROWS);
  assert.equal(ownerOf(3, t, {}), 3);
  assert.equal(ownerOf(100, t, { 100: 3 }), 3);
  assert.equal(ownerOf(101, t, {}), undefined);
});

test("expandedByPath keeps rows open across a rewrite that renumbers them", () => {
  const before = build(ROWS);
  assert.equal(pathOf(before, 8), "Model/Block_1/Dense_0");
  // a rewrite that inserts a row before Block_1: its ids move by one
  const after = build([...ROWS.slice(0, 4), call(7, 2, "activation", "relu", "relu"),
    call(8, 1, "module_call", "Block_1", "Block"), call(9, 8, "module_call", "Dense_0", "Dense")]);
  assert.deepEqual([...expandedByPath(before, new Set([1, 7]), after)].sort(), [1, 8]);
  assert.deepEqual([...expandedByPath(before, new Set([1000]), after)].sort(), [1, 2, 8]); // none left: the default
});

// -- folding runs of calls alike -------------------------------------------------------------------------
/** A model of `layers` blocks alike (key 1), each `i > [attn (2) > [p0, p1, p2 (3, 3, 3)], mlp (4)]`, then a
 * head (5); ids as Python numbers them (positions in the XML view: each call's equations take ids after it). */
function stack(layers, { head = true } = {}) {
  const rows = [call(0, -1, "module_call", "Model", "Model")];
  let id = 1;
  const add = (parent, name, fold, neq = 0) => {
    const at = id;
    rows.push(callRow({ id: at, parent, name, type: name, fold, neq }));
    id += 1 + neq; // its equations' ids follow it
    return at;
  };
  for (let l = 0; l < layers; l++) {
    const b = add(0, `${l}`, 1);
    const attn = add(b, "attn", 2, 1);
    for (const n of ["p0", "p1", "p2"]) add(attn, n, 3, 2);
    add(b, "mlp", 4, 1);
  }
  if (head) add(0, "head", 5, 1);
  return rows;
}

test("foldRuns: 3 or more consecutive calls alike fold; 2 do not; a foreign key or an equation between cuts", () => {
  const t = build(stack(5));
  const [run] = foldRuns(t.byId.get(0));
  assert.deepEqual(run.members.map((m) => m.name), ["0", "1", "2", "3", "4"]);
  assert.deepEqual(run.offsets, [0, 14, 28, 42, 56]);
  assert.equal(run.path, "Model/0");
  assert.equal(run.row.name, "0 … 4");
  assert.equal(run.row.id, 1); // the first member's row, renamed
  assert.equal(foldRuns(t.byId.get(0)), foldRuns(t.byId.get(0))); // cached
  // p0, p1, p2 alike fold inside every attn; two layers do not
  assert.deepEqual(foldRuns(t.byId.get(2)).map((r) => r.row.name), ["p0 … p2"]);
  assert.deepEqual(foldRuns(build(stack(2)).byId.get(0)), []);
  // an equation of the parent run between members 2 and 3 cuts the run: [0 1 2] and [3 4]
  const eqs = new Map([[0, eqNodes(t.byId.get(0), [equationRow({ id: 42.5, primitive: "add" })])]]);
  assert.deepEqual(foldRuns(t.byId.get(0), eqs).map((r) => r.members.length), [3]);
  assert.equal(foldName([{ name: "x" }, { name: "x" }, { name: "x" }]), "x");
  // alike, but named as three roles (q, k, v): not repeats of one layer, three rows
  const roles = buildTree(fixtureRecords(stack(2))
    .map((r) => ({ ...r, name: { p0: "q", p1: "k", p2: "v" }[r.name] ?? r.name })));
  assert.deepEqual(foldRuns(roles.byId.get(2)), []);
});

test("foldRuns: members whose subtrees do not line up are not folded", () => {
  const rows = stack(3, { head: false });
  // layer 1 loses its mlp (ids unchanged)
  rows.splice(fixtureRecords(rows).findIndex((r) => r.name === "mlp" && r.parent === 15), 1);
  assert.deepEqual(foldRuns(build(rows).byId.get(0)), []);
  const keyless = fixtureRecords(stack(4)).map((r) => ({ ...r, fold: null }));
  assert.deepEqual(foldRuns(buildTree(keyless).byId.get(0)), []); // no keys (an older kernel): nothing folds
});

test("layout: a folded row stands for its members; opening it shows the first's inside, standing for all", () => {
  const t = build(stack(4));
  const folds = { open: new Set() };
  let { rows, stands } = layout(t, new Set([0]), new Map(), null, folds);
  assert.deepEqual(rows.map((n) => n.name), ["Model", "0 … 3", "head"]);
  assert.deepEqual(stands, [null, [0, 14, 28, 42], null]);
  ({ rows, stands } = layout(t, new Set([0, 1, 2]), new Map(), null, folds));
  assert.deepEqual(rows.map((n) => n.name), ["Model", "0 … 3", "attn", "p0 … p2", "mlp", "head"]);
  // p0 … p2 inside the folded layers stands for the p0, p1 and p2 of every layer: 12 calls
  assert.deepEqual(stands[3], [0, 14, 28, 42].flatMap((o) => [o, o + 3, o + 6]));
  assert.deepEqual(stands[2], [0, 14, 28, 42]);
  // unfolded by path: every layer on its row, their own p0 … p2 folded
  folds.open.add("Model/0");
  ({ rows, stands } = layout(t, new Set([0, 1, 2]), new Map(), null, folds));
  assert.deepEqual(rows.map((n) => n.name), ["Model", "0", "attn", "p0 … p2", "mlp", "1", "2", "3", "head"]);
  assert.deepEqual(stands[3], [0, 3, 6]);
  // no folding: what visibleRows always gave
  assert.deepEqual(visibleRows(t, new Set([0, 1])).map((n) => n.name), ["Model", "0", "attn", "mlp", "1", "2", "3",
    "head"]);
});

test("layout with a filter: a run folds when the filter keeps all of its members or tells none apart", () => {
  const t = build(stack(4));
  const folds = { open: new Set() };
  const names = (keep) => layout(t, new Set(), new Map(), keep, folds).rows.map((n) => n.name);
  assert.deepEqual(names(filterKeep(t, "mlp")), ["Model", "0 … 3", "mlp"]); // every layer's mlp: still folded
  assert.deepEqual(names(filterKeep(t, "Model/2/attn/p1")), ["Model", "2", "attn", "p1"]); // one layer: unfolded
  // "only matches" with matches in layers 1 and 3: those two, each on its row
  assert.deepEqual(names(matchKeep(t, [27, 44], {})), ["Model", "1", "mlp", "3", "attn"]);
});

test("shownAs and foldsAround: where a call inside a folded run is shown, and which runs hide it", () => {
  const t = build(stack(4));
  const folds = { open: new Set() };
  // layer 2's p1 (layer 2 starts at 29: attn 30, p0 32, p1 35): shown as layer 0's p0 (id 4), whose row stands for it
  assert.equal(pathOf(t, 35), "Model/2/attn/p1");
  assert.equal(shownAs(t, 35, new Map(), folds), 4);
  assert.equal(shownAs(t, 35, new Map(), null), 35);
  assert.deepEqual(foldsAround(t, 35, new Map(), folds).map(({ run, k }) => [run.path, k]),
    [["Model/0", 2], ["Model/2/attn/p0", 1]]);
  folds.open.add("Model/0");
  assert.equal(shownAs(t, 35, new Map(), folds), 32); // layer 2's own p0 … p2 row
  assert.equal(pathOf(t, 57), "Model/head");
  assert.deepEqual(foldsAround(t, 57, new Map(), folds), []); // the head: in no run
});

test("layout of Llama-70B's tree: 80 layers, 11,000 rows with equations, in a few milliseconds", () => {
  // 1,526 calls, ~10,000 equations: the shape bench/bench_structure70b.py opens
  const rows = [callRow({ id: 0, parent: -1, name: "Model", type: "Model" })];
  const eqs = new Map();
  let id = 1;
  const add = (parent, name, fold, neq) => {
    const at = id;
    rows.push(callRow({ id: at, parent, name, type: name, fold, neq }));
    id += 1 + neq;
    return at;
  };
  const layers = add(0, "layers", 0, 0);
  for (let l = 0; l < 80; l++) {
    const b = add(layers, `${l}`, 1, 9);
    for (const [name, k, n] of [["input_layernorm", 2, 13], ["self_attn", 3, 28], ["post_attention_layernorm", 2, 13],
      ["mlp", 4, 1]]) {
      const c = add(b, name, k, n);
      for (let j = 0; j < 4; j++) add(c, `proj_${j}`, 5 + j, 3);
    }
  }
  const tree = build(rows);
  for (const n of tree.byId.values()) {
    if (n.neq) eqs.set(n.id, eqNodes(n, Array.from({ length: n.neq }, (_, j) => equationRow({ id: n.id + 1 + j,
      primitive: "add" }))));
  }
  const all = allExpandable(tree);
  const t0 = performance.now();
  const flat = layout(tree, all, eqs, null, null);
  const t1 = performance.now();
  const folded = layout(tree, all, eqs, null, { open: new Set() });
  const t2 = performance.now();
  assert.equal(flat.rows.length, rows.length + [...eqs.values()].reduce((k, e) => k + e.length, 0));
  assert.ok(flat.rows.length > 10000, `${flat.rows.length} rows`);
  assert.equal(folded.rows.filter((n) => n.run).length, 1); // the 80 layers: one row
  assert.ok(folded.rows.length < 200, `${folded.rows.length} rows folded`);
  assert.ok(t1 - t0 < 100 && t2 - t1 < 100, `layout took ${t1 - t0} ms, folded ${t2 - t1} ms`);
});
