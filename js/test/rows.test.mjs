import assert from "node:assert/strict";
import { test } from "node:test";
import {
  FIXTURE_CALL_COLUMNS, FIXTURE_EQUATION_COLUMNS, callRecords, callRow, equationRecords, equationRow, fixtureRecords,
  treeRecords, treeTrait,
} from "../src/rows.js";

// Rows exactly as yax_widget/_payloads.py sends them (`CALL_COLUMNS`, `EQUATION_COLUMNS`;
// docs/widget.md), with the columns naming their positions; every other test builds its rows with
// callRow/equationRow, in the fixtures' own order.
const PY_CALL_COLUMNS = ["id", "parent", "kind", "name", "type", "attrs", "ins", "outs", "params", "neq", "fields",
  "copies", "policy", "fold", "sharding", "source"];
const PY_EQUATION_COLUMNS = ["id", "primitive", "ins", "outs", "params", "source"];
const PY_CALL = [3, 2, "module_call", "Dense_0", "Dense", "features=64", "f32[2,8,32]", "f32[2,8,64]",
  2112, 2, "features=64 use_bias=True", 4, "f32/bf16/f32", 7, "kernel=P(None,'model') bias=P()", "model.py:12"];
const PY_EQUATION = [17, "dot_general", "f32[2,8,32] f32[32,64]", "f32[2,8,64]", "dimension_numbers=…", "model.py:12"];
const DENSE = {
  id: 3, parent: 2, kind: "module_call", name: "Dense_0", type: "Dense", attrs: "features=64",
  ins: "f32[2,8,32]", outs: "f32[2,8,64]", params: 2112, neq: 2, fields: "features=64 use_bias=True", eq: false,
  copies: 4, policy: "f32/bf16/f32", fold: 7, sharding: "kernel=P(None,'model') bias=P()", source: "model.py:12",
};
const DOT = {
  id: 17, parent: 3, kind: "equation", name: "dot_general", type: "", attrs: "dimension_numbers=…",
  ins: "f32[2,8,32] f32[32,64]", outs: "f32[2,8,64]", params: 0, neq: 0, fields: "dimension_numbers=…", eq: true,
  source: "model.py:12",
};

/** The first `n` columns of Python's rows: a kernel that sends fewer. */
const first = (n) => treeRecords({ version: 0, columns: PY_CALL_COLUMNS.slice(0, n), rows: [PY_CALL.slice(0, n)] })[0];

test("a call row as Python sends it is read by the names of its columns", () => {
  assert.deepEqual(treeRecords({ version: 2, columns: PY_CALL_COLUMNS, rows: [PY_CALL] }), [DENSE]);
  assert.equal(first(10).fields, ""); // fields may be absent
  assert.equal(first(11).copies, 1); // and copies
  assert.equal(first(12).policy, ""); // and the policy
  assert.equal(first(13).fold, null); // and the structure key: such a row never folds
  const keyZero = callRecords([...PY_CALL_COLUMNS.slice(0, 13), "fold"], [[...PY_CALL.slice(0, 13), 0]])[0];
  assert.equal(keyZero.fold, 0); // key 0 is a key
  assert.equal(first(14).sharding, ""); // and the sharding: nothing is split
  assert.equal(first(15).source, ""); // and the source: no line known
});

test("an equation row reads like a call row: the primitive is its name", () => {
  const reply = { type: "ok", id: 3, columns: PY_EQUATION_COLUMNS, rows: [PY_EQUATION] };
  assert.deepEqual(equationRecords(reply, reply.rows, 3), [DOT]); // from the reply
  assert.deepEqual(equationRecords(PY_EQUATION_COLUMNS, [PY_EQUATION], 3), [DOT]); // or its columns
  const [sourceless] = equationRecords(PY_EQUATION_COLUMNS.slice(0, 5), [PY_EQUATION.slice(0, 5)], 3);
  assert.equal(sourceless.source, ""); // the source may be absent
});

test("the same rows with their columns in another order give the same records: read by name, not position", () => {
  const shuffle = (columns, seed) => columns.map((c, i) => [(i * seed + 5) % columns.length, c]).sort(([a], [b]) => a - b)
    .map(([, c]) => c); // the columns sorted by a key of their position: a fixed reordering
  const reorder = (columns, row, order) => order.map((c) => row[columns.indexOf(c)]);
  for (const seed of [3, 5, 7, 11]) {
    const calls = shuffle(PY_CALL_COLUMNS, seed);
    assert.notDeepEqual(calls, PY_CALL_COLUMNS);
    assert.deepEqual(treeRecords({ version: 0, columns: calls, rows: [reorder(PY_CALL_COLUMNS, PY_CALL, calls)] }), [DENSE]);
    const eqs = shuffle(PY_EQUATION_COLUMNS, seed);
    assert.notDeepEqual(eqs, PY_EQUATION_COLUMNS);
    assert.deepEqual(equationRecords({ columns: eqs }, [reorder(PY_EQUATION_COLUMNS, PY_EQUATION, eqs)], 3), [DOT]);
  }
  // a column the front-end does not know is passed over
  assert.deepEqual(treeRecords({ columns: ["later", ...PY_CALL_COLUMNS], rows: [["?", ...PY_CALL]] }), [DENSE]);
});

test("rows without their columns are refused with a sentence, never read by guess", () => {
  assert.throws(() => treeRecords({ version: 1, rows: [PY_CALL] }),
    /The tree's rows came without `columns`.*restart the kernel/);
  assert.throws(() => callRecords(PY_CALL_COLUMNS.filter((c) => c !== "name" && c !== "kind"), [PY_CALL]),
    /The tree's rows lack the columns `kind`, `name`: their `columns` are `id`, `parent`, `type`/);
  assert.throws(() => equationRecords({ type: "ok", rows: [PY_EQUATION] }, [PY_EQUATION], 3),
    /The equations' rows came without `columns`/);
  assert.throws(() => equationRecords(undefined, [], 3), /came without `columns`/); // even with no rows to read
  assert.throws(() => equationRecords(["id"], [], 3), /lack the columns `primitive`, `ins`, `outs`, `params`/);
});

test("callRow and equationRow lay out fixtures in their own order, which the readers read back", () => {
  const { eq, ...fields } = DENSE;
  assert.equal(eq, false);
  assert.deepEqual(callRow(fields), FIXTURE_CALL_COLUMNS.map((c) => DENSE[c]));
  assert.notDeepEqual(FIXTURE_CALL_COLUMNS, PY_CALL_COLUMNS); // not Python's order: no test leans on it
  assert.deepEqual(fixtureRecords([callRow(DENSE)]), [DENSE]);
  assert.deepEqual(fixtureRecords([callRow({ id: 0, parent: -1, name: "Model" })]), [{ id: 0, parent: -1,
    kind: "module_call", name: "Model", type: "", attrs: "", ins: "", outs: "", params: 0, neq: 0, fields: "", eq: false,
    copies: 1, policy: "", fold: null, sharding: "", source: "" }]);
  const row = equationRow({ id: 17, primitive: "dot_general", ins: "f32[2,8,32] f32[32,64]",
    outs: "f32[2,8,64]", params: "dimension_numbers=…", source: "model.py:12" });
  assert.deepEqual(equationRecords(FIXTURE_EQUATION_COLUMNS, [row], 3), [DOT]);
  assert.deepEqual([...FIXTURE_CALL_COLUMNS].sort(), [...PY_CALL_COLUMNS].sort()); // the same names
  assert.deepEqual([...FIXTURE_EQUATION_COLUMNS].sort(), [...PY_EQUATION_COLUMNS].sort());
});

test("treeRecords reads a `_tree` trait value, empty before the first", () => {
  assert.deepEqual(treeRecords(treeTrait([callRow(DENSE)], 2)), [DENSE]);
  assert.deepEqual(treeTrait([], 2), { version: 2, columns: [...FIXTURE_CALL_COLUMNS], rows: [] });
  assert.deepEqual(treeRecords({}), []);
  assert.deepEqual(treeRecords(undefined), []);
});
