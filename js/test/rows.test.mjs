import assert from "node:assert/strict";
import { test } from "node:test";
import {
  CALL, EQUATION, callRecord, callRow, equationRecord, equationRow, treeRows,
} from "../src/rows.js";

// Rows exactly as yax_widget/_explorer.py sends them (docs/widget.md): this file pins the
// positions; every other test builds its rows with callRow/equationRow.
const PY_CALL = [3, 2, "module_call", "Dense_0", "Dense", "features=64", "f32[2,8,32]", "f32[2,8,64]",
  2112, 2, "features=64 use_bias=True", 4, "f32/bf16/f32", 7, "kernel=P(None,'model') bias=P()", "model.py:12"];
const PY_EQUATION = [17, "dot_general", "f32[2,8,32] f32[32,64]", "f32[2,8,64]", "dimension_numbers=…", "model.py:12"];

test("a call row as Python sends it is read by name", () => {
  assert.deepEqual(callRecord(PY_CALL), {
    id: 3, parent: 2, kind: "module_call", name: "Dense_0", type: "Dense", attrs: "features=64",
    ins: "f32[2,8,32]", outs: "f32[2,8,64]", params: 2112, neq: 2, fields: "features=64 use_bias=True", eq: false,
    copies: 4, policy: "f32/bf16/f32", fold: 7, sharding: "kernel=P(None,'model') bias=P()", source: "model.py:12",
  });
  assert.equal(callRecord(PY_CALL.slice(0, 10)).fields, ""); // fields may be absent
  assert.equal(callRecord(PY_CALL.slice(0, 11)).copies, 1); // and copies
  assert.equal(callRecord(PY_CALL.slice(0, 12)).policy, ""); // and the policy
  assert.equal(callRecord(PY_CALL.slice(0, 13)).fold, null); // and the structure key: such a row never folds
  assert.equal(callRecord([...PY_CALL.slice(0, 13), 0]).fold, 0); // key 0 is a key
  assert.equal(callRecord(PY_CALL.slice(0, 14)).sharding, ""); // and the sharding: nothing is split
  assert.equal(callRecord(PY_CALL.slice(0, 15)).source, ""); // and the source: no line known
  assert.equal(Object.keys(CALL).length, PY_CALL.length);
});

test("an equation row reads like a call row: the primitive is its name", () => {
  assert.deepEqual(equationRecord(PY_EQUATION, 3), {
    id: 17, parent: 3, kind: "equation", name: "dot_general", type: "", attrs: "dimension_numbers=…",
    ins: "f32[2,8,32] f32[32,64]", outs: "f32[2,8,64]", params: 0, neq: 0, fields: "dimension_numbers=…", eq: true,
    source: "model.py:12",
  });
  assert.equal(equationRecord(PY_EQUATION.slice(0, 5), 3).source, ""); // the source may be absent
  assert.equal(Object.keys(EQUATION).length, PY_EQUATION.length);
});

test("callRow and equationRow are the inverses used by fixtures", () => {
  const rec = callRecord(PY_CALL);
  assert.deepEqual(callRow(rec), PY_CALL);
  assert.deepEqual(callRow({ id: 0, parent: -1, name: "Model" }),
    [0, -1, "module_call", "Model", "", "", "", "", 0, 0, "", 1, "", null, "", ""]);
  assert.deepEqual(equationRow({ id: 17, primitive: "dot_general", ins: "f32[2,8,32] f32[32,64]",
    outs: "f32[2,8,64]", params: "dimension_numbers=…", source: "model.py:12" }), PY_EQUATION);
});

test("treeRows reads a `_tree` trait value, empty before the first", () => {
  assert.deepEqual(treeRows({ version: 2, rows: [PY_CALL] }), [PY_CALL]);
  assert.deepEqual(treeRows({}), []);
  assert.deepEqual(treeRows(undefined), []);
});
