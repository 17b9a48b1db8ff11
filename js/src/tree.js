// The module tree: rows from Python (read by rows.js) -> nodes, and the
// flat list of visible rows for the virtualised view. No DOM here.
import { equationRecords } from "./rows.js";

/** Build the tree from call records (rows.js, `treeRecords`): `byId` (id -> node), `roots`, each node
 * a record with `children`, `depth` and `path` (names from the top, "Model/Block_0/Dense_0"). */
export function buildTree(records) {
  const byId = new Map();
  const roots = [];
  for (const r of records) {
    const node = { ...r, children: [], depth: 0 };
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

/** Equation rows as leaf nodes under `parent`; `source`: the reply carrying them, or its `columns`
 * (rows.js, `equationRecords`). */
export function equationNodes(parent, source, eqRows) {
  return equationRecords(source, eqRows, parent.id)
    .map((r) => Object.assign(r, { children: [], depth: parent.depth + 1 }));
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

// -- folding: runs of calls alike shown as one ×N row ---------------------------------------
//
// Consecutive sibling calls with the same structure key (`fold`, column 13: equal exactly when they
// compute the same thing up to their weights, yax._fold) form a run; a run of FOLD_MIN or more is
// shown as one row, the run's `row`: the first member's record under the name `0 … 79`, whose inside
// is the first member's. Members alike have subtrees alike, and ids are positions in the XML view, so
// the node at the same place in member k has the id of the first member's plus `offsets[k]`: a row
// inside a folded run stands for the ids `id + o` (its `stands`), and shows what any of them shows.

/** Runs shorter than this stay unfolded: a k_proj beside a v_proj reads better as two rows. */
export const FOLD_MIN = 3;

/** A name without its numbers: calls alike fold when their names differ only there (`layers_3`, `Dense_0`,
 * `17`), as repeated layers are named; `q`, `k` and `v` alike are three roles, and stay three rows. */
const stem = (name) => String(name).replace(/\d+/g, "#");

const runCache = new WeakMap(); // parent node -> {own: its equations when computed, runs}

/** Does a sorted list of equation nodes hold one strictly between ids `a` and `b`? */
function between(eqs, a, b) {
  let lo = 0;
  let hi = eqs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (eqs[mid].id <= a) lo = mid + 1;
    else hi = mid;
  }
  return lo < eqs.length && eqs[lo].id < b;
}

/** Do the subtrees of calls `a` and `b` line up row for row, `b`'s ids `a`'s shifted by one offset? */
function linedUp(a, b) {
  const d = b.id - a.id;
  const stack = [[a, b]];
  while (stack.length) {
    const [x, y] = stack.pop();
    if (y.id - x.id !== d || x.fold !== y.fold || x.children.length !== y.children.length) return false;
    for (let i = 0; i < x.children.length; i++) stack.push([x.children[i], y.children[i]]);
  }
  return true;
}

/** How a folded row is named: its first and last members' names (`0 … 79`), or the name they share. */
export function foldName(members) {
  const a = members[0].name;
  const b = members[members.length - 1].name;
  return a === b ? a : `${a} … ${b}`;
}

/** The runs of `parent`'s calls that fold: FOLD_MIN or more consecutive calls with the same key and names
 * differing only in their numbers (and differing: one helper called three times, `attn._split_heads` for the
 * query, key and value, is three steps of its call, not three layers), with no equation of `parent` (`eqs`: call id -> loaded equation nodes) run between two of them, and subtrees that
 * line up. Each `{members, offsets, path, row}`: `path` names it (the first member's path; kept across a
 * rewrite), `row` is the row shown for it. Cached until the tree or `parent`'s equations change. */
export function foldRuns(node, eqs = new Map()) {
  const parent = node.run ? node.run.members[0] : node; // a folded row's runs are its first member's
  const own = eqs.get(parent.id) || null;
  const hit = runCache.get(parent);
  if (hit && hit.own === own) return hit.runs;
  const runs = [];
  const kids = parent.children;
  for (let i = 0, j; i < kids.length; i = j) {
    const first = kids[i];
    j = i + 1;
    if (first.fold === null || first.fold === undefined) continue;
    const name = stem(first.name);
    while (j < kids.length && kids[j].fold === first.fold && stem(kids[j].name) === name && kids[j].name !== kids[j - 1].name
      && !(own && between(own, kids[j - 1].id, kids[j].id)) && linedUp(first, kids[j])) j++;
    if (j - i < FOLD_MIN) continue;
    const members = kids.slice(i, j);
    const run = { members, offsets: members.map((m) => m.id - first.id), path: first.path };
    run.row = { ...first, name: foldName(members), run };
    runs.push(run);
  }
  runCache.set(parent, { own, runs });
  return runs;
}

/** `offs` (null: the ids themselves) combined with a run's offsets: what rows inside a run inside a run stand for. */
function within(offs, offsets) {
  return offs === null ? offsets : offs.flatMap((p) => offsets.map((o) => p + o));
}

/** The visible rows and what each stands for: `{rows, stands}`, `stands[i]` null for a row that is itself,
 * else the offsets `o` of the ids `rows[i].id + o` a folded row or a row inside one stands for. In document
 * order: children of expanded nodes, with their equations (`eqs`: id -> nodes) in program order among the
 * calls; `keep`: the ids filters keep (a folded row is kept when any member is; a run of which a filter keeps
 * some members and not others is shown unfolded, the kept ones each on its row); `folds`: null (no folding)
 * or `{open}`, the paths of runs the user unfolded. Without recursion. */
export function layout(tree, expanded, eqs = new Map(), keep = null, folds = null) {
  const rows = [];
  const stands = [];
  const kept = (n, offs) => !keep || keep.has(n.id) || (offs !== null && offs.some((o) => keep.has(n.id + o)));
  const stack = [];
  for (let i = tree.roots.length - 1; i >= 0; i--) stack.push([tree.roots[i], null]);
  while (stack.length) {
    const [node, offs] = stack.pop();
    if (!kept(node, offs)) continue;
    rows.push(node);
    stands.push(offs);
    if (node.eq || !(expanded.has(node.id) || (keep && node.children.some((c) => kept(c, offs))))) continue;
    const below = keep ? node.children : inProgramOrder(node.children, eqs.get(node.id) || []);
    const runs = folds ? foldRuns(node, eqs).filter((r) => !folds.open.has(r.path)) : [];
    if (!runs.length) {
      for (let i = below.length - 1; i >= 0; i--) stack.push([below[i], offs]);
      continue;
    }
    const starts = new Map(runs.map((r) => [r.members[0], r]));
    const later = new Set(runs.flatMap((r) => r.members.slice(1)));
    const out = [];
    for (const n of below) {
      const run = starts.get(n);
      if (run) {
        const some = keep ? run.members.filter((m) => kept(m, offs)).length : run.members.length;
        if (some === run.members.length) out.push([run.row, within(offs, run.offsets)]);
        else for (const m of run.members) out.push([m, offs]); // the filter tells them apart: each its own row
      } else if (!later.has(n)) out.push([n, offs]);
    }
    for (let i = out.length - 1; i >= 0; i--) stack.push(out[i]);
  }
  return { rows, stands };
}

/** The flat list of visible nodes (`layout`'s rows). */
export function visibleRows(tree, expanded, eqs = new Map(), keep = null, folds = null) {
  return layout(tree, expanded, eqs, keep, folds).rows;
}

/** The calls from the top down to call `id` (itself included). */
function chainTo(tree, id) {
  const out = [];
  for (let n = tree.byId.get(id); n; n = tree.byId.get(n.parent)) out.push(n);
  return out.reverse();
}

/** The folded runs (`folds.open` leaves some unfolded) that hide call `id` or hold it: `[{run, k}]`, from
 * the top, `k` the index of the member that is `id` or holds it (0: the first, whose inside a folded row
 * shows; above 0: hidden). */
export function foldsAround(tree, id, eqs, folds) {
  const out = [];
  if (!folds) return out;
  const chain = chainTo(tree, id);
  for (let i = 1; i < chain.length; i++) {
    for (const run of foldRuns(chain[i - 1], eqs)) {
      const k = run.members.indexOf(chain[i]);
      if (k >= 0 && !folds.open.has(run.path)) out.push({ run, k });
    }
  }
  return out;
}

/** The id of the row call `id` is shown as: itself, or inside a folded run's later member the call at the
 * same place in the first member (runs in runs too), whose row stands for it. */
export function shownAs(tree, id, eqs, folds) {
  if (!folds || !tree.byId.has(id)) return id;
  const chain = chainTo(tree, id);
  let off = 0;
  for (let i = 1; i < chain.length; i++) {
    const parent = tree.byId.get(chain[i - 1].id - off);
    const node = tree.byId.get(chain[i].id - off);
    if (!parent || !node) return id;
    for (const run of foldRuns(parent, eqs)) {
      const k = run.members.indexOf(node);
      if (k > 0 && !folds.open.has(run.path)) off += run.offsets[k];
    }
  }
  return id - off;
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
