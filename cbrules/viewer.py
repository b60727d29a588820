"""The HTML step viewer: one self-contained page to step through a lowering trace.

The page lists the steps (rule, phase, bindings, created / erased / changed nodes), shows the
graph before and after the selected step as SVG (laid out by :mod:`cbrules.svg`) with the nodes
the step touched coloured, and the generated CUDA with each annotated line linked to its node and
to the step that created it. Everything is inline (data as JSON, style, script): the page fetches
nothing. ``#step=N`` in the address selects step N when the page opens. Script errors are shown
in a box at the top (and logged), so a test can see them in the DOM.
"""
from __future__ import annotations

import json
import re
from html import escape
from typing import Any, Callable, Optional

from .rewrite.engine import Trace
from .ir.graph import KernelGraph
from .svg import graph_svg
from .trace import final_graph, graph_at

# an annotated CUDA line ends in "... @ file:line #ID" or "... #ID (from ...)" (cbrules.codegen.cuda)
_NODE_NOTE = re.compile(r" #(\d+)(?: \(from .*\))?$")


def page(trace: Trace, cuda: str, title: str, cuda_at: Optional[Callable[[KernelGraph], str]] = None) -> str:
    """The viewer page for ``trace`` and the annotated ``cuda`` of its final graph; ``cuda_at``, if
    given, makes the CUDA of the graph after each step (a graph it cannot make CUDA of raises, and
    the page shows that step's program instead)."""
    graphs: list[str] = []
    index: dict[int, int] = {}
    values = _Values(trace)

    def svg_of(g: KernelGraph) -> int:
        if id(g) not in index:
            index[id(g)] = len(graphs)
            graphs.append(graph_svg(g))
            values.add_graph(g)
        return index[id(g)]

    def nodes(g: KernelGraph, ids) -> list:
        """[id, description without the leading #id] of each node."""
        return [[n, g.describe(n).split(" ", 1)[1] if n in g else "?"] for n in ids]

    steps = [{"step": 0, "rule": "as built", "at": "", "phase": "", "bindings": {}, "created": [], "erased": [],
              "changed": [], "before": svg_of(trace.initial), "after": svg_of(trace.initial)}]
    for r in trace.records:
        before, after = graph_at(trace, r.step - 1), graph_at(trace, r.step)
        steps.append({"step": r.step, "rule": r.rule, "at": r.at, "phase": r.phase, "bindings": r.bindings,
                      "created": nodes(after, r.created), "erased": nodes(before, r.erased),
                      "changed": nodes(after, r.changed), "egg": {k: v for k, v in (r.egg or {}).items() if v},
                      "before": svg_of(before), "after": svg_of(after),
                      "changes": _changes(before, after, r.changed)})
    for st in steps:
        st["code"] = values.code_of(graph_at(trace, st["step"]), cuda_at)
    final = final_graph(trace)
    origin = {n: final[n]["origin"].get("step", 0) for n in final.nodes()}
    lines = []
    source = cuda.splitlines()
    kernel = next((i for i, t in enumerate(source) if t.startswith('extern "C"')), 0)
    if kernel:  # the fixed prelude says nothing about this trace
        lines.append({"text": f"// ... the prelude ({kernel} lines of device helpers) ...", "node": None, "step": None})
    for text in source[kernel:]:
        m = _NODE_NOTE.search(text)
        node: Optional[int] = int(m.group(1)) if m else None
        lines.append({"text": text, "node": node, "step": origin.get(node, 0) if node is not None else None,
                      "inserted": values.inserted(final, node) if node is not None else None})
    data = {"title": title, "steps": steps, "graphs": graphs, "cuda": lines, "infos": values.infos,
            "table": values.table, "codes": values.codes}
    # JSON inside <script>: no "<" may end the element or open a comment
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    # one pass over the template: a title (a kernel or file name) holding "{{DATA}}" stays text
    fill = {"{{TITLE}}": escape(title), "{{DATA}}": blob}
    return _PLACEHOLDER.sub(lambda m: fill[m.group(0)], _TEMPLATE)


_PLACEHOLDER = re.compile(r"\{\{(?:TITLE|DATA)\}\}")


MAX_VALUE_TEXT = 400  # characters of one attribute value shown (a long term is cut, and says so)


def value_text(v: Any) -> str:
    """An attribute value as the page shows it: terms as C-like text, tuples and dicts as lists."""
    if isinstance(v, tuple):
        text = "(" + ", ".join(value_text(x) for x in v) + ")"
    elif isinstance(v, dict):
        text = "{" + ", ".join(f"{k}: {value_text(x)}" for k, x in v.items()) + "}"
    elif hasattr(v, "kind") and hasattr(v, "name") and not isinstance(v, str):  # a kernel parameter
        text = f"{v.kind} {v.name}"
    else:
        text = str(v)
    return text if len(text) <= MAX_VALUE_TEXT else text[:MAX_VALUE_TEXT] + f"... ({len(text)} characters)"


def _attributes(g: KernelGraph, n: int) -> list[list[str]]:
    return [[k, value_text(v)] for k, v in sorted(g[n].items()) if k not in ("op", "origin")]


def _changes(before: KernelGraph, after: KernelGraph, changed) -> list[list]:
    """[node, key, old, new] of every attribute a step changed on its changed nodes."""
    out = []
    for n in changed:
        if n in before and n in after:
            old, new = before[n], after[n]
            for k in sorted(set(old) | set(new)):
                if k != "origin" and old.get(k, _ABSENT) is not new.get(k, _ABSENT) and \
                        value_text(old.get(k, "(absent)")) != value_text(new.get(k, "(absent)")):
                    out.append([n, k, value_text(old.get(k, "(absent)")), value_text(new.get(k, "(absent)"))])
    return out


_ABSENT = object()


class _Values:
    """What the page shows of nodes: every attribute and the node's lineage, per graph (each distinct
    text once in ``table``, a graph's ``infos`` entry mapping node -> its row), and the code after
    each step (each distinct text once in ``codes``)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.table: list[list] = []
        self._rows: dict[str, int] = {}
        self.infos: list[dict] = []
        self.codes: list[str] = []
        self._code_index: dict[str, int] = {}
        self._code_of: dict[int, int] = {}

    def add_graph(self, g: KernelGraph) -> None:
        info = {}
        for n in g.nodes():
            row = [g.op(n), _attributes(g, n), *self._lineage(g, n)]
            key = json.dumps(row, separators=(",", ":"), default=str)
            if key not in self._rows:
                self._rows[key] = len(self.table)
                self.table.append(row)
            info[n] = self._rows[key]
        self.infos.append(info)

    def _lineage(self, g: KernelGraph, n: int) -> list:
        """[origin text, the node it was cloned from or None, the step that first inserted it]."""
        o = g[n].get("origin", {})
        made = f"rule {o['rule']} @ {o.get('at', '?')}, step {o.get('step', '?')}" if o.get("rule") \
            else f"built at {o.get('where', '?')}"
        return [made, o.get("from"), self.inserted(g, n)]

    def inserted(self, g: KernelGraph, n: int) -> int:
        """The step that first made ``n`` or the node it was cloned from, back along the clones (0: built)."""
        seen = set()
        while n is not None and n not in seen:
            seen.add(n)
            holder = g if n in g else next((h for h in [*reversed(list(self.trace.graphs.values())),
                                                        self.trace.initial] if n in h), None)
            if holder is None:
                return 0
            o = holder[n].get("origin", {})
            if "from" not in o:
                return o.get("step", 0) if o.get("rule") else 0
            g, n = holder, o["from"]
        return 0

    def code_of(self, g: KernelGraph, cuda_at: Optional[Callable[[KernelGraph], str]]) -> int:
        """The index in ``codes`` of the CUDA after a step (its program where no CUDA can be made yet)."""
        if id(g) not in self._code_of:
            text = None
            if cuda_at is not None:
                try:
                    text = cuda_at(g)
                    cut = text.find('extern "C"')
                    text = text[cut:] if cut > 0 else text
                except Exception as e:  # noqa: BLE001 -- a graph mid-lowering may not print as CUDA
                    text = f"// no CUDA after this step ({type(e).__name__}: {e}); the program:\n"
            if text is None or text.startswith("// no CUDA"):
                from .schedule import print_program, schedule
                text = (text or "// the program after this step:\n") + print_program(schedule(g), ids=True)
            if text not in self._code_index:
                self._code_index[text] = len(self.codes)
                self.codes.append(text)
            self._code_of[id(g)] = self._code_index[text]
        return self._code_of[id(g)]


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{{TITLE}}</title>
<style>
body { margin: 0; font: 13px system-ui, sans-serif; display: grid; grid-template-columns: 300px 1fr;
       grid-template-rows: auto auto 1fr 34vh; height: 100vh; }
#left { display: flex; flex-direction: column; min-height: 0; border-right: 1px solid #ccc; }
#search { margin: 4px; padding: 3px 6px; font: 12px monospace; }
#legend { grid-column: 1 / 3; padding: 2px 10px; background: #f6f6fa; border-bottom: 1px solid #ddd; font-size: 12px; }
#legend span.sw { display: inline-block; width: 12px; height: 10px; border: 1px solid #999; margin: 0 3px 0 10px; }
#node { font-family: monospace; border: 1px solid #ccd; background: #fafaff; padding: 4px 8px; margin: 0 0 6px 10px;
        float: right; width: 42%; max-height: 30vh; overflow: auto; font-size: 12px; }
.graphs { clear: both; }
#node table { border-collapse: collapse; } #node td { padding: 0 8px 0 0; vertical-align: top; word-break: break-all; }
#node td:first-child { white-space: nowrap; word-break: normal; }
#tip { position: fixed; z-index: 5; pointer-events: none; background: #ffe; border: 1px solid #aa8; padding: 3px 6px;
       font: 11px monospace; max-width: 520px; white-space: pre-wrap; word-break: break-all; }
.change { font-family: monospace; margin-left: 18px; word-break: break-all; } .change .old { color: #a33; }
.change .new { color: #262; }
#codebar { font: 12px system-ui, sans-serif; padding: 2px 0 4px; position: sticky; top: 0; background: #fff; }
#panel h2, #panel div { overflow-wrap: anywhere; }
header { grid-column: 1 / 3; padding: 6px 10px; background: #223; color: #eee; }
#errors { grid-column: 1 / 3; background: #fdd; color: #900; white-space: pre-wrap; padding: 4px 10px; }
#steps { overflow: auto; margin: 0; padding: 0; list-style: none; flex: 1; }
#steps li { padding: 3px 8px; cursor: pointer; border-bottom: 1px solid #eee; font-family: monospace; }
#steps li.selected { background: #dde7ff; }
#steps li .phase { color: #777; }
#panel { overflow: auto; padding: 6px 12px; }
#panel h2 { font-size: 15px; margin: 4px 0; }
.touched { font-family: monospace; margin: 2px 0; }
.created-list .nid { background: #c8f7c5; } .erased-list .nid { background: #f7c5c5; }
.changed-list .nid { background: #f7f0c5; }
.graphs { display: flex; gap: 12px; align-items: flex-start; }
.graphs > div { flex: 1; overflow: auto; border: 1px solid #ddd; max-height: 46vh; min-width: 0; }
.graphs h3 { font-size: 12px; margin: 2px 4px; }
svg text { font: 11px monospace; }
svg rect { fill: #f4f4f8; stroke: #99a; }
svg .created rect { fill: #c8f7c5; stroke: #2a2; } svg .erased rect { fill: #f7c5c5; stroke: #c22; }
svg .changed rect { fill: #f7f0c5; stroke: #aa2; }
svg path.contains { fill: none; stroke: #bbb; } svg path.depends { fill: none; stroke: #68c; stroke-dasharray: 3 2; }
#cuda { grid-column: 1 / 3; overflow: auto; margin: 0; border-top: 1px solid #ccc; font: 12px monospace;
        padding: 4px 8px; white-space: pre; }
#cuda .line.hit { background: #dde7ff; }
#cuda a { color: #36c; cursor: pointer; text-decoration: underline; }
</style></head>
<body>
<header><b>{{TITLE}}</b> &mdash; click a step; hover or click a node for its attributes; click a step link in the
CUDA to jump to the step that made (or first inserted) its node</header>
<div id="errors" hidden></div>
<div id="legend"><b>legend</b><span class="sw" style="background:#c8f7c5"></span>created
<span class="sw" style="background:#f7c5c5"></span>erased <span class="sw" style="background:#f7f0c5"></span>changed
(old &rarr; new) &nbsp; grey elbow: contains (scope &rarr; child) &nbsp; dashed blue arc: depends (runs before, one scope)
&nbsp; step N: made by step N; inserted N: the step that made the node a clone was copied from</div>
<div id="left"><input id="search" type="search" placeholder="search: #id, op, rule or phase">
<ul id="steps"></ul></div>
<div id="panel"></div>
<pre id="cuda"></pre>
<div id="tip" hidden></div>
<script id="data" type="application/json">{{DATA}}</script>
<script>
"use strict";
const errors = document.getElementById("errors");
function report(message) { errors.hidden = false; errors.textContent += message + "\\n"; }
window.addEventListener("error", e => report("error: " + e.message));
document.addEventListener("securitypolicyviolation", e => report("blocked: " + e.blockedURI));
const consoleError = console.error.bind(console);
console.error = (...args) => { report("console.error: " + args.join(" ")); consoleError(...args); };

const data = JSON.parse(document.getElementById("data").textContent);
const list = document.getElementById("steps"), panel = document.getElementById("panel");

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function touched(title, cls, items) {
  const box = el("div", "touched " + cls);
  box.appendChild(el("b", "", title + " (" + items.length + "): "));
  for (const [id, text] of items) {
    const item = el("div", "item");
    item.dataset.node = id;
    item.appendChild(el("span", "nid", "#" + id));
    item.appendChild(document.createTextNode(" " + text));
    box.appendChild(item);
  }
  return box;
}

const tip = document.getElementById("tip");
function info(svgIndex, id) {
  const row = data.infos[svgIndex][id];
  return row === undefined ? null : data.table[row];  // [op, [[key, text], ...], origin, cloned from, inserted]
}
function infoText(id, r) {
  return "#" + id + " " + r[0] + "\\n" + r[1].map(([k, v]) => ":" + k + " " + v).join("\\n") + "\\n" + r[2] +
    (r[3] !== null && r[3] !== undefined ? "\\ncloned from #" + r[3] : "") + (r[4] ? "\\nfirst inserted at step " + r[4] : "");
}
function stepLink(n, label) {
  const a = el("a", "", label);
  a.addEventListener("click", () => { const li = list.querySelector('li[data-step="' + n + '"]'); if (li) li.click(); });
  return a;
}
function showNode(svgIndex, id) {
  const r = info(svgIndex, id), box = document.getElementById("node");
  if (!r || !box) return;
  box.replaceChildren();
  box.dataset.node = id;
  box.appendChild(el("b", "", "#" + id + " " + r[0]));
  const t = el("table", "");
  for (const [k, v] of r[1]) {
    const tr = el("tr", "attr");
    tr.appendChild(el("td", "", ":" + k));
    tr.appendChild(el("td", "", v));
    t.appendChild(tr);
  }
  box.appendChild(t);
  const line = el("div", "lineage", r[2]);
  if (r[3] !== null && r[3] !== undefined) line.appendChild(document.createTextNode("; cloned from #" + r[3]));
  if (r[4]) { line.appendChild(document.createTextNode("; first inserted at ")); line.appendChild(stepLink(r[4], "step " + r[4])); }
  box.appendChild(line);
}
function hover(holder, svgIndex) {
  holder.addEventListener("mousemove", e => {
    const g = e.target.closest ? e.target.closest("g.node") : null;
    const r = g ? info(svgIndex, g.dataset.node) : null;
    if (!r) { tip.hidden = true; return; }
    tip.textContent = infoText(g.dataset.node, r);
    tip.hidden = false;
    tip.style.left = Math.min(e.clientX + 14, window.innerWidth - 540) + "px";
    tip.style.top = Math.min(e.clientY + 14, window.innerHeight - 200) + "px";
  });
  holder.addEventListener("mouseleave", () => { tip.hidden = true; });
  holder.addEventListener("click", e => {
    const g = e.target.closest ? e.target.closest("g.node") : null;
    if (g) showNode(svgIndex, g.dataset.node);
  });
}

function graph(title, svgIndex, marks) {
  const box = el("div", "");
  box.appendChild(el("h3", "", title));
  const holder = el("div", "svg");
  holder.innerHTML = data.graphs[svgIndex];  // made by cbrules.svg: escaped text, no script
  hover(holder, svgIndex);
  for (const [cls, ids] of marks)
    for (const [id] of ids) {
      const g = holder.querySelector('g.node[data-node="' + id + '"]');
      if (!g) continue;
      g.classList.add(cls);
      const y = Number(g.querySelector("rect").getAttribute("y"));
      if (!("focus" in box.dataset) || y < Number(box.dataset.focus)) box.dataset.focus = y;
    }
  box.appendChild(holder);
  return box;
}

function select(n) {
  const s = data.steps.find(x => x.step === n);
  if (!s) { report("no step " + n); return; }
  for (const li of list.children) li.classList.toggle("selected", Number(li.dataset.step) === n);
  panel.replaceChildren();
  panel.dataset.step = n;
  panel.appendChild(el("h2", "", "step " + s.step + ": " + s.rule + (s.at ? " @ " + s.at : "")));
  if (s.phase) panel.appendChild(el("div", "", "phase " + s.phase));
  const b = Object.entries(s.bindings).map(([k, v]) => k + "=" + v).join("  ");
  if (b) panel.appendChild(el("div", "bindings", "bindings: " + b));
  if (s.egg && Object.keys(s.egg).length)
    panel.appendChild(el("div", "", "egglog matches: " + Object.entries(s.egg).map(([k, v]) => k + ":" + v).join(", ")));
  const nodeBox = el("div", "");
  nodeBox.id = "node";
  nodeBox.textContent = "click a node (in a graph or a list) to see all its attributes";
  panel.appendChild(nodeBox);  // floats right of the lists, above the graphs
  panel.appendChild(touched("created", "created-list", s.created));
  panel.appendChild(touched("erased", "erased-list", s.erased));
  const changed = touched("changed", "changed-list", s.changed);
  for (const [id, k, o, v] of (s.changes || [])) {
    const c = el("div", "change");
    c.dataset.node = id;
    c.appendChild(document.createTextNode("#" + id + " :" + k + " "));
    c.appendChild(el("span", "old", o));
    c.appendChild(document.createTextNode(" \\u2192 "));
    c.appendChild(el("span", "new", v));
    changed.appendChild(c);
  }
  panel.appendChild(changed);
  for (const item of panel.querySelectorAll(".touched .item"))
    item.addEventListener("click", () => showNode(item.closest(".erased-list") ? s.before : s.after, item.dataset.node));
  const pics = el("div", "graphs");
  pics.appendChild(graph("before step " + s.step, s.before, [["erased", s.erased], ["changed", s.changed]]));
  pics.appendChild(graph("after step " + s.step, s.after, [["created", s.created], ["changed", s.changed]]));
  panel.appendChild(pics);
  const first = s.created.length ? [s.after, s.created[0][0]] : s.changed.length ? [s.after, s.changed[0][0]] : null;
  if (first) showNode(first[0], first[1]);
  showCode(s);
  for (const box of pics.children)  // the first node the step touched, in view
    if ("focus" in box.dataset) box.scrollTop = Math.max(0, Number(box.dataset.focus) - 60);
}

for (const s of data.steps) {
  const li = el("li", "");
  li.dataset.step = s.step;
  li.appendChild(el("span", "", s.step + " "));
  li.appendChild(el("span", "phase", s.phase ? "[" + s.phase + "] " : ""));
  li.appendChild(el("span", "rule", s.rule));
  li.addEventListener("click", () => select(s.step));
  list.appendChild(li);
}
const cuda = document.getElementById("cuda");
let finalShown = false, current = null;
function showCode(s) {
  current = s;
  cuda.replaceChildren();
  const bar = el("div", "");
  bar.id = "codebar";
  const toggle = el("a", "", finalShown ? "show the CUDA after this step" : "show the final CUDA (annotated, linked)");
  toggle.addEventListener("click", () => { finalShown = !finalShown; showCode(current); });
  bar.appendChild(el("b", "", finalShown ? "final CUDA  " : "CUDA after step " + s.step + "  "));
  bar.appendChild(toggle);
  cuda.appendChild(bar);
  if (!finalShown) {
    const pre = el("div", "after-step", data.codes[s.code]);
    pre.dataset.step = s.step;
    cuda.appendChild(pre);
    return;
  }
  for (const div of finalLines) cuda.appendChild(div);
  for (const line of cuda.querySelectorAll(".line"))
    line.classList.toggle("hit", s.created.some(([id]) => String(id) === line.dataset.node));
}
const finalLines = [];
for (const line of data.cuda) {
  const div = el("div", "line");
  div.appendChild(document.createTextNode(line.text + (line.node === null ? "" : "  ")));
  if (line.node !== null) {
    div.dataset.node = line.node;
    const a = el("a", "", "step " + line.step);
    a.title = "the step that made #" + line.node;
    a.addEventListener("click", () => list.querySelector('li[data-step="' + line.step + '"]').click());
    div.appendChild(a);
    if (line.inserted && line.inserted !== line.step) {
      div.appendChild(document.createTextNode(" "));
      const ins = stepLink(line.inserted, "inserted " + line.inserted);
      ins.title = "the step that made the node #" + line.node + " is a clone of";
      div.appendChild(ins);
    }
  }
  finalLines.push(div);
}
const search = document.getElementById("search");
function matches(s, q) {
  if (!q) return true;
  const id = /^#?(\\d+)$/.exec(q);
  const touchedIds = [...s.created, ...s.erased, ...s.changed].map(([n]) => String(n));
  if (id) return touchedIds.includes(id[1]) || Object.values(s.bindings).includes("#" + id[1]);
  const texts = [s.rule, s.phase, ...[...s.created, ...s.erased, ...s.changed].map(([, t]) => t.split("(")[0])];
  return texts.some(t => t && t.toLowerCase().includes(q.toLowerCase()));
}
search.addEventListener("input", () => {
  const q = search.value.trim();
  for (const li of list.children) li.hidden = !matches(data.steps.find(x => x.step === Number(li.dataset.step)), q);
});
const wanted = /^#step=(\\d+)$/.exec(location.hash);
const first = list.querySelector('li[data-step="' + (wanted ? wanted[1] : "0") + '"]');
if (first) first.click(); else report("no step " + (wanted ? wanted[1] : "0") + " in this trace");
document.body.dataset.ready = "yes";
</script>
</body></html>
"""
