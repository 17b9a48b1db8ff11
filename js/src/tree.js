// The module tree: rows from Python (read by rows.js) -> nodes, and the
// flat list of visible rows for the virtualised view. No DOM here.
import { callRecord, equationRecord } from "./rows.js";

/** Build the tree from call rows: `byId` (id -> node), `roots`, each node a row's record
 * (rows.js) with `children`, `depth` and `path` (names from the top, "Model/Block_0/Dense_0"). */
export function buildTree(rows) {
  const byId = new Map();
  const roots = [];
  for (const r of rows) {
    const node = Object.assign(callRecord(r), { children: [], depth: 0 });
    byId.set(node.id, node);
    const p = byId.get(node.parent);
    if (p) {
      node.depth = p.depth + 1;
      node.path = `${p.path}/${node.name}`;
      p.children.push(node);
    } else {
      node.path = node.name;
      roots.push(node);
    }
  }
  return { byId, roots };
}

/** Equation rows `[id, primitive, in, out, params]` as leaf nodes under `parent`. */
export function equationNodes(parent, eqRows) {
  return eqRows.map((r) => Object.assign(equationRecord(r, parent.id), { children: [], depth: parent.depth + 1 }));
}

/** Can the node be expanded (calls with children or equations)? */
export function expandable(node) {
  return !node.eq && (node.children.length > 0 || node.neq > 0);
}

/** Ids of the ancestors of `ids` (not the ids themselves), via `parentOf(id)`. */
export function ancestorsOf(ids, parentOf) {
  const out = new Set();
  for (const id of ids) {
    let p = parentOf(id);
    while (p !== undefined && p !== null && p >= 0 && !out.has(p)) {
      out.add(p);
      p = parentOf(p);
    }
  }
  return out;
}

/** Nodes kept by a name filter: those whose name, type or path contain the text
 * (case-insensitive; "layer/3/attention" finds that call by its path), and their
 * ancestors. `null` when no filter. */
export function filterKeep(tree, text) {
  const t = (text || "").trim().toLowerCase();
  if (!t) return null;
  const keep = new Set();
  for (const node of tree.byId.values()) {
    if (`${node.name} ${node.type}`.toLowerCase().includes(t) || (node.path || "").toLowerCase().includes(t)) {
      keep.add(node.id);
      for (const a of ancestorsOf([node.id], (i) => tree.byId.get(i)?.parent)) keep.add(a);
    }
  }
  return keep;
}

/** The calls to keep for "only matches": the calls matched or running a matched equation
 * (`owners`: `_match_owners`), and their ancestors. */
export function matchKeep(tree, ids, owners) {
  const calls = ids.map((id) => ownerOf(id, tree, owners)).filter((x) => x !== undefined && tree.byId.has(x));
  const keep = new Set(calls);
  for (const a of ancestorsOf(calls, (i) => tree.byId.get(i)?.parent)) keep.add(a);
  return keep;
}

/** Both filters at once: nodes kept by each (`null`: that filter is off). */
export function bothKept(a, b) {
  if (!a) return b;
  if (!b) return a;
  return new Set([...a].filter((x) => b.has(x)));
}

/** Ids of every call with children or equations: "expand all". */
export function allExpandable(tree) {
  const out = new Set();
  for (const node of tree.byId.values()) if (expandable(node)) out.add(node.id);
  return out;
}

/** Index in `visible` of the next (`step` 1) or previous (-1) row in `set` after position
 * `from` (-1: none yet), wrapping around; -1 when there is none. */
export function nextIndex(visible, set, from, step) {
  const n = visible.length;
  for (let k = 1; k <= n; k++) {
    const i = (((from < 0 && step < 0 ? 0 : from) + step * k) % n + n) % n;
    if (set.has(visible[i].id)) return i;
  }
  return -1;
}

/** `calls` and `eqs` (each in document order) merged by id: ids are positions in the XML view,
 * so this is program order (an equation between two calls is listed between them). */
export function inProgramOrder(calls, eqs) {
  if (!eqs.length) return calls;
  const out = [];
  let j = 0;
  for (const c of calls) {
    while (j < eqs.length && eqs[j].id < c.id) out.push(eqs[j++]);
    out.push(c);
  }
  return out.concat(eqs.slice(j));
}

/** The flat list of visible nodes, in document order: children of expanded nodes, with
 * their equations (`eqs`: id -> nodes) in program order among the calls. Without recursion. */
export function visibleRows(tree, expanded, eqs = new Map(), keep = null) {
  const out = [];
  const stack = [...tree.roots].reverse();
  while (stack.length) {
    const node = stack.pop();
    if (keep && !keep.has(node.id)) continue;
    out.push(node);
    if (node.eq || !(expanded.has(node.id) || (keep && node.children.some((c) => keep.has(c.id))))) continue;
    const below = keep ? node.children : inProgramOrder(node.children, eqs.get(node.id) || []);
    for (let i = below.length - 1; i >= 0; i--) stack.push(below[i]);
  }
  return out;
}

/** Ids of the nodes to expand initially: those above `levels`. */
export function initialExpanded(tree, levels = 2) {
  const out = new Set();
  for (const node of tree.byId.values()) if (node.depth < levels && node.children.length) out.add(node.id);
  return out;
}

/** The call an id belongs to: itself for calls, for equations the owner in `owners`
 * (`_match_owners`: {equation id as a string: call id}); undefined when unknown. */
export function ownerOf(id, tree, owners) {
  return tree.byId.has(id) ? id : owners[String(id)];
}

/** The path of names from the root to `id` ("Model/Block_0/Dense_0"). */
export function pathOf(tree, id) {
  const out = [];
  for (let n = tree.byId.get(id); n; n = tree.byId.get(n.parent)) out.push(n.name);
  return out.reverse().join("/");
}

/** The ids of `next` to expand so that what was open in `prev` stays open: ids change with a
 * rewrite, so they are matched by path. Falls back to `initialExpanded` when none survives. */
export function expandedByPath(prev, expanded, next) {
  const open = new Set([...expanded].map((id) => pathOf(prev, id)));
  const out = new Set();
  for (const n of next.byId.values()) if (open.has(pathOf(next, n.id))) out.add(n.id);
  return out.size ? out : initialExpanded(next);
}
