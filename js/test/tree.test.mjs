import assert from "node:assert/strict";
import { test } from "node:test";
import {
  ancestorsOf, buildTree, equationNodes, expandable, expandedByPath, filterKeep, initialExpanded, ownerOf, pathOf,
  visibleRows,
} from "../src/tree.js";
import { callRow, equationRow } from "../src/rows.js";

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
  const t = buildTree(ROWS);
  assert.deepEqual(t.roots.map((n) => n.id), [1]);
  assert.deepEqual(t.byId.get(2).children.map((n) => n.id), [3, 6]);
  assert.deepEqual([...t.byId.values()].map((n) => n.depth), [0, 1, 2, 2, 1, 2]);
  assert.equal(t.byId.get(3).attrs, "features=2");
  assert.equal(t.byId.get(3).fields, "features=2 use_bias=True");
  assert.equal(t.byId.get(2).fields, "");
});

test("visibleRows follows the expanded set; equations in program order among the calls", () => {
  const t = buildTree(ROWS);
  assert.deepEqual(visibleRows(t, new Set()).map((n) => n.id), [1]);
  assert.deepEqual(visibleRows(t, new Set([1])).map((n) => n.id), [1, 2, 7]);
  const eqs = new Map([[1, equationNodes(t.byId.get(1), [equationRow({ id: 100, primitive: "add" })])]]);
  assert.deepEqual(visibleRows(t, new Set([1, 2]), eqs).map((n) => n.id), [1, 2, 3, 6, 7, 100]);
  // ids are document order: an equation run between two calls is listed between them (GPT-2's
  // gelu equations sit between c_fc and c_proj, not after c_proj)
  const mid = new Map([[2, equationNodes(t.byId.get(2), [equationRow({ id: 5, primitive: "mul" }),
    equationRow({ id: 6.5, primitive: "add" })])]]);
  assert.deepEqual(visibleRows(t, new Set([1, 2]), mid).map((n) => n.id), [1, 2, 3, 5, 6, 6.5, 7]);
  const eq = eqs.get(1)[0];
  assert.equal(eq.depth, 1);
  assert.equal(eq.name, "add");
  assert.equal(expandable(eq), false);
  assert.equal(expandable(t.byId.get(6)), true); // an activation with equations
});

test("initialExpanded opens the top levels only", () => {
  const t = buildTree(ROWS);
  assert.deepEqual([...initialExpanded(t, 2)].sort(), [1, 2, 7]);
  assert.deepEqual([...initialExpanded(t, 1)], [1]);
});

test("ancestorsOf collects every ancestor once, not the ids", () => {
  const t = buildTree(ROWS);
  const up = ancestorsOf([3, 8, 6], (i) => t.byId.get(i)?.parent);
  assert.deepEqual([...up].sort(), [1, 2, 7]);
  assert.deepEqual([...ancestorsOf([1], (i) => t.byId.get(i)?.parent)], []);
});

test("filterKeep keeps matches and their ancestors; visibleRows shows them expanded", () => {
  const t = buildTree(ROWS);
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
  const tree = buildTree(rows);
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
  const t = buildTree(ROWS);
  assert.equal(ownerOf(3, t, {}), 3);
  assert.equal(ownerOf(100, t, { 100: 3 }), 3);
  assert.equal(ownerOf(101, t, {}), undefined);
});

test("expandedByPath keeps rows open across a rewrite that renumbers them", () => {
  const before = buildTree(ROWS);
  assert.equal(pathOf(before, 8), "Model/Block_1/Dense_0");
  // a rewrite that inserts a row before Block_1: its ids move by one
  const after = buildTree([...ROWS.slice(0, 4), call(7, 2, "activation", "relu", "relu"),
    call(8, 1, "module_call", "Block_1", "Block"), call(9, 8, "module_call", "Dense_0", "Dense")]);
  assert.deepEqual([...expandedByPath(before, new Set([1, 7]), after)].sort(), [1, 8]);
  assert.deepEqual([...expandedByPath(before, new Set([1000]), after)].sort(), [1, 2, 8]); // none left: the default
});
