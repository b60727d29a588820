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
from typing import Optional

from .rewrite.engine import Trace
from .ir.graph import KernelGraph
from .svg import graph_svg
from .trace import final_graph, graph_at

# an annotated CUDA line ends in "... @ file:line #ID" or "... #ID (from ...)" (cbrules.codegen.cuda)
_NODE_NOTE = re.compile(r" #(\d+)(?: \(from .*\))?$")


def page(trace: Trace, cuda: str, title: str) -> str:
    """The viewer page for ``trace`` and the annotated ``cuda`` of its final graph."""
    graphs: list[str] = []
    index: dict[int, int] = {}

    def svg_of(g: KernelGraph) -> int:
        if id(g) not in index:
            index[id(g)] = len(graphs)
            graphs.append(graph_svg(g))
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
                      "before": svg_of(before), "after": svg_of(after)})
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
        lines.append({"text": text, "node": node, "step": origin.get(node, 0) if node is not None else None})
    data = {"title": title, "steps": steps, "graphs": graphs, "cuda": lines}
    # JSON inside <script>: no "<" may end the element or open a comment
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    # one pass over the template: a title (a kernel or file name) holding "{{DATA}}" stays text
    fill = {"{{TITLE}}": escape(title), "{{DATA}}": blob}
    return _PLACEHOLDER.sub(lambda m: fill[m.group(0)], _TEMPLATE)


_PLACEHOLDER = re.compile(r"\{\{(?:TITLE|DATA)\}\}")


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{{TITLE}}</title>
<style>
body { margin: 0; font: 13px system-ui, sans-serif; display: grid; grid-template-columns: 330px 1fr;
       grid-template-rows: auto 1fr 38vh; height: 100vh; }
header { grid-column: 1 / 3; padding: 6px 10px; background: #223; color: #eee; }
#errors { grid-column: 1 / 3; background: #fdd; color: #900; white-space: pre-wrap; padding: 4px 10px; }
#steps { overflow: auto; margin: 0; padding: 0; list-style: none; border-right: 1px solid #ccc; }
#steps li { padding: 3px 8px; cursor: pointer; border-bottom: 1px solid #eee; font-family: monospace; }
#steps li.selected { background: #dde7ff; }
#steps li .phase { color: #777; }
#panel { overflow: auto; padding: 6px 12px; }
#panel h2 { font-size: 15px; margin: 4px 0; }
.touched { font-family: monospace; margin: 2px 0; }
.created-list .nid { background: #c8f7c5; } .erased-list .nid { background: #f7c5c5; }
.changed-list .nid { background: #f7f0c5; }
.graphs { display: flex; gap: 12px; align-items: flex-start; }
.graphs > div { flex: 1; overflow: auto; border: 1px solid #ddd; max-height: 60vh; }
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
<header><b>{{TITLE}}</b> &mdash; click a step; click a #id in the CUDA to jump to the step that made it</header>
<div id="errors" hidden></div>
<ul id="steps"></ul>
<div id="panel"></div>
<pre id="cuda"></pre>
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

function graph(title, svgIndex, marks) {
  const box = el("div", "");
  box.appendChild(el("h3", "", title));
  const holder = el("div", "svg");
  holder.innerHTML = data.graphs[svgIndex];  // made by cbrules.svg: escaped text, no script
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
  panel.appendChild(touched("created", "created-list", s.created));
  panel.appendChild(touched("erased", "erased-list", s.erased));
  panel.appendChild(touched("changed", "changed-list", s.changed));
  const pics = el("div", "graphs");
  pics.appendChild(graph("before step " + s.step, s.before, [["erased", s.erased], ["changed", s.changed]]));
  pics.appendChild(graph("after step " + s.step, s.after, [["created", s.created], ["changed", s.changed]]));
  panel.appendChild(pics);
  for (const box of pics.children)  // the first node the step touched, in view
    if ("focus" in box.dataset) box.scrollTop = Math.max(0, Number(box.dataset.focus) - 60);
  for (const line of document.querySelectorAll("#cuda .line"))
    line.classList.toggle("hit", s.created.some(([id]) => String(id) === line.dataset.node));
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
for (const line of data.cuda) {
  const div = el("div", "line");
  div.appendChild(document.createTextNode(line.text + (line.node === null ? "" : "  ")));
  if (line.node !== null) {
    div.dataset.node = line.node;
    const a = el("a", "", "step " + line.step);
    a.title = "the step that made #" + line.node;
    a.addEventListener("click", () => list.querySelector('li[data-step="' + line.step + '"]').click());
    div.appendChild(a);
  }
  cuda.appendChild(div);
}
const wanted = /^#step=(\\d+)$/.exec(location.hash);
const first = list.querySelector('li[data-step="' + (wanted ? wanted[1] : "0") + '"]');
if (first) first.click(); else report("no step " + (wanted ? wanted[1] : "0") + " in this trace");
document.body.dataset.ready = "yes";
</script>
</body></html>
"""
