// The selection across a rewrite (treefollow.js): a row is found again by its kind and path, the k-th
// of those where a module is called k times, as `xpath_for` names a node; an equation by its place
// among its call's equations of its primitive.
import assert from "node:assert/strict";
import { test } from "node:test";
import { FIXTURE_EQUATION_COLUMNS, callRow, equationRow, fixtureRecords } from "../src/rows.js";
import { buildTree, equationNodes } from "../src/tree.js";
import { equationPlace, sameRow } from "../src/treefollow.js";

const call = (id, parent, name, kind = "module_call") => callRow({ id, parent, kind, name, type: name });
const build = (rows) => buildTree(fixtureRecords(rows));

// a model whose `shared` Dense is called twice, and a helper method of `attn`
const before = build([call(1, -1, "Model"), call(2, 1, "shared"), call(5, 1, "attn"),
  call(6, 5, "attn._split_heads", "method_call"), call(9, 1, "shared"), call(12, 1, "gelu", "activation")]);
// the same model after a change before them: every id moved
const after = build([call(1, -1, "Model"), call(2, 1, "new", "function"), call(4, 1, "shared"), call(7, 1, "attn"),
  call(8, 7, "attn._split_heads", "method_call"), call(11, 1, "shared"), call(14, 1, "gelu", "activation")]);

test("a row is found again by its kind and path, and the k-th of a module called k times", () => {
  assert.equal(sameRow(before, 2, after), 4); // the first call of `shared`
  assert.equal(sameRow(before, 9, after), 11); // its second call
  assert.equal(sameRow(before, 6, after), 8); // the helper method, named with its method
  assert.equal(sameRow(before, 1, after), 1);
});

test("a row that is gone, or is now of another kind, is not found", () => {
  const gelu = build([call(1, -1, "Model"), call(2, 1, "gelu", "function")]); // same path, not an activation
  assert.equal(sameRow(before, 12, gelu), null);
  assert.equal(sameRow(before, 9, gelu), null); // one `shared` call fewer
  assert.equal(sameRow(before, 99, after), null); // not a row of the tree before
});

test("an equation's place: the k-th of its primitive in its call", () => {
  const owner = before.byId.get(2);
  const eqs = new Map([[2, equationNodes(owner, FIXTURE_EQUATION_COLUMNS, [equationRow({ id: 3, primitive: "dot_general" }),
    equationRow({ id: 4, primitive: "add" }), equationRow({ id: 40, primitive: "add" })])]]);
  assert.deepEqual(equationPlace(eqs, 40), { owner: 2, primitive: "add", k: 1 });
  assert.deepEqual(equationPlace(eqs, 3), { owner: 2, primitive: "dot_general", k: 0 });
  assert.equal(equationPlace(eqs, 5), null);
});
