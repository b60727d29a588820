"""The HTML step viewer: a self-contained page, opened in a real headless Chromium.

The browser tests need Debian's ``chromium`` (``.ci/run`` installs it when it can) or a browser
named by ``$CBRULES_BROWSER``; without one they skip and say so. The screenshot goes to
``$CBRULES_ARTIFACTS`` (CI keeps it) or the test's temporary folder.
"""
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cbrules import api, viewer
from cbrules.cli import main
from cbrules.kernels import get
from cbrules.svg import graph_svg
from rulekit import write_rules

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str:
    found = os.environ.get("CBRULES_BROWSER") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not found:
        pytest.skip("no headless Chromium here: install Debian's chromium package (.ci/run does when it can) "
                    "or point CBRULES_BROWSER at a Chromium binary")
    return found


def chromium(page: Path, *args: str, step: int) -> subprocess.CompletedProcess:
    """Run the browser headless on ``page#step=N``; the page's script runs within the virtual time."""
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={page.parent / 'profile'}", "--virtual-time-budget=5000", *args,
           f"{page.resolve().as_uri()}#step={step}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class Dom(HTMLParser):
    """What the test reads back from the dumped DOM: the panel's step, the nodes listed under
    created, the coloured nodes of each graph, and the error box."""

    def __init__(self, text: str):
        super().__init__()
        self.stack: list[dict] = []
        self.panel_step = None
        self.listed: dict[str, list[int]] = {}
        self.coloured: dict[str, set[int]] = {}
        self.errors = {"hidden": None, "text": ""}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        self.stack.append({"tag": tag, "id": a.get("id"), "classes": classes})
        if a.get("id") == "panel":
            self.panel_step = int(a["data-step"]) if "data-step" in a else None
        if a.get("id") == "errors":
            self.errors["hidden"] = "hidden" in a
        if "item" in classes and "data-node" in a:
            kind = next(c for s in reversed(self.stack) for c in s["classes"] if c.endswith("-list"))
            self.listed.setdefault(kind, []).append(int(a["data-node"]))
        if tag == "g" and "node" in classes:
            for c in classes:
                if c in ("created", "erased", "changed"):
                    self.coloured.setdefault(c, set()).add(int(a["data-node"]))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        if any(s["id"] == "errors" for s in self.stack):
            self.errors["text"] += data


@pytest.fixture(scope="module")
def lowered():
    return api.lower(get("single_dim").build(stages=2), debug=True)


def test_the_page_is_self_contained(tmp_path, capsys):
    out = tmp_path / "steps.html"
    assert main(["trace", "single_dim", "--stages", "2", "--html", str(out)]) == 0
    assert "steps; open it in a browser" in capsys.readouterr().out
    text = out.read_text()
    page, data = re.fullmatch(r'(.*<script id="data" type="application/json">)(.*?)(</script>.*)', text, re.S).group(
        1, 2)[0] + text.split("</script>", 1)[1], text.split('type="application/json">', 1)[1].split("</script>")[0]
    # the data cannot make markup (every < escaped); the page itself names nothing to fetch: no
    # src/href attribute, no url(), no link or import; the one http text is SVG's namespace name
    assert "<" not in data and "src" in data
    assert not re.search(r"\b(src|href)\s*=|url\(|<link|@import|fetch\(|XMLHttpRequest", page)
    assert set(re.findall(r"https?://[^\s\"'<>\\]+", text)) <= {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in text  # and the browser refuses any fetch the page might still try


def test_the_svg_layout_has_every_node_once(lowered):
    svg = graph_svg(lowered)
    assert sorted(map(int, re.findall(r'<g class="node" data-node="(\d+)"', svg))) == sorted(lowered.nodes())
    assert svg.count('class="depends"') == len(lowered.depends_edges())


def test_hostile_text_stays_text(tmp_path):
    folder = tmp_path / "evil"
    write_rules(folder, """
        (phase evil :after cb-pipeline)
        (graph-rule tag-it :phase evil :match ((syncthreads ?s :tag (absent)))
          :rewrite ((let ?evil "</script><script>document.title='owned'</script><b>") (set ?s :tag ?evil)))
    """)
    kg = api.lower(get("single_dim").build(stages=2), rules=[folder], debug=True)
    page = viewer.page(kg.trace, "", "t")
    assert "</script><script>document.title" not in page and "\\u003c/script>" in page
    if not (os.environ.get("CBRULES_BROWSER") or any(map(shutil.which, BROWSERS))):
        return  # the browser half is below; the page itself was checked above
    (tmp_path / "evil.html").write_text(page)
    step = next(r.step for r in kg.trace.records if r.rule == "tag-it")
    run = chromium(tmp_path / "evil.html", "--dump-dom", step=step)
    assert "<title>t</title>" in run.stdout and "owned" not in run.stdout.split("<body")[0]
    assert "?evil=&lt;/script&gt;&lt;script&gt;document.title='owned'&lt;/script&gt;&lt;b&gt;" in run.stdout
    assert Dom(run.stdout).errors == {"hidden": True, "text": ""}


def test_select_a_step_in_chromium_and_take_a_screenshot(lowered, tmp_path):
    main_step = next(r for r in lowered.trace.records if r.rule == "cb-main")
    page = tmp_path / "steps.html"
    assert main(["trace", "single_dim", "--stages", "2", "--html", str(page)]) == 0
    run = chromium(page, "--dump-dom", step=main_step.step)
    assert run.returncode == 0, run.stderr[-2000:]
    dom = Dom(run.stdout)
    assert dom.panel_step == main_step.step
    assert dom.listed["created-list"] == main_step.created and len(main_step.created) > 3
    assert dom.coloured["created"] == set(main_step.created)  # coloured in the after graph
    assert dom.errors == {"hidden": True, "text": ""}, dom.errors
    assert "Uncaught" not in run.stderr and "CONSOLE" not in run.stderr
    shots = Path(os.environ.get("CBRULES_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "viewer-single_dim-cb-main.png"
    run = chromium(page, "--window-size=1400,1000", f"--screenshot={shot}", step=main_step.step)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_page_reports_its_own_errors_in_chromium(tmp_path, capsys):
    page = tmp_path / "steps.html"
    assert main(["trace", "single_dim", "--stages", "2", "--html", str(page)]) == 0
    dom = Dom(chromium(page, "--dump-dom", step=999).stdout)  # no such step: the page says so
    assert dom.errors["hidden"] is False and "no step 999" in dom.errors["text"]


def test_a_failed_lowering_still_writes_its_steps(tmp_path, capsys):
    folder = tmp_path / "refuse"
    write_rules(folder, """
        (phase late :after cb-stage)
        (graph-rule refuse :phase late :match ((for ?L :part (absent))) :rewrite ((fail "no thanks: {?L}")))
    """)
    page = tmp_path / "failed.html"
    assert main(["trace", "single_dim", "--stages", "2", "--rules", str(folder), "--html", str(page)]) == 1
    out, err = capsys.readouterr()
    assert "steps before lowering failed" in out and "no thanks: #2" in err
    text = page.read_text()
    assert "// lowering failed: no thanks: #2" in text and '"rule":"cb-war-sync"' in text


def test_a_placeholder_in_the_title_is_not_filled(tmp_path, capsys):
    """Issue 28: a kernel file named {{DATA}}.py (its name is the page's title) stays text: the
    data is written once, into its script element, and the title is the name itself."""
    kg = api.lower(get("single_dim").build(stages=2), debug=True, stop_after=2)
    page = viewer.page(kg.trace, "// {{TITLE}} {{DATA}}", "cbrules trace {{DATA}} {{TITLE}}: 2 steps")
    assert page.count('"steps":') == 1 and "<title>cbrules trace {{DATA}} {{TITLE}}: 2 steps</title>" in page
    assert re.search(r'<script id="data" type="application/json">\{"title":', page)


# ---------------------------------------------------------------- issue 32: the viewer shows values
def _data(page: str) -> dict:
    import json
    return json.loads(page.split('type="application/json">', 1)[1].split("</script>")[0])


def test_the_page_holds_every_attribute_old_to_new_the_cuda_after_each_step_and_lineage(lowered):
    from cbrules.codegen.cuda import emit
    from cbrules.schedule import schedule
    from cbrules.trace import graph_at
    t = lowered.trace
    data = _data(viewer.page(t, emit(schedule(lowered), annotate=True).text, "t",
                             cuda_at=lambda g: emit(schedule(g)).text))
    main_step = next(r for r in t.records if r.rule == "cb-main")
    s = next(x for x in data["steps"] if x["step"] == main_step.step)
    after = data["infos"][s["after"]]
    g = graph_at(t, main_step.step)
    wait = next(n for n in main_step.created if g[n]["op"] == "mbarrier_wait")
    op, attrs, made, cloned_from, inserted = data["table"][after[str(wait)]]
    assert op == "mbarrier_wait" and {k for k, _ in attrs} >= {"barrier", "slot", "parity"}
    assert dict(attrs)["slot"] == str(g[wait]["slot"])  # terms as text
    assert made.startswith("rule cb-main @ rules/circular_buffer.rules:") and cloned_from is not None
    assert 0 < inserted < main_step.step  # the step that inserted the wait it was cloned from
    # old -> new of what a step changed
    prefetch = next(x for x in data["steps"] if x["rule"] == "cb-default-prefetch")
    assert [2, "annotations", "{circular_buffer: {stages: 2}}", "{circular_buffer: {stages: 2, prefetch: 1}}"] \
        in prefetch["changes"]
    # the CUDA after the last step is the kernel's; an early step shows its program (no CUDA yet)
    assert data["codes"][data["steps"][-1]["code"]].startswith('extern "C" __global__')
    assert data["codes"][data["steps"][0]["code"]].startswith("// no CUDA after this step")
    cloned = [x for x in data["cuda"] if x["node"] is not None and x["inserted"] not in (0, x["step"])]
    assert cloned and all(x["inserted"] < x["step"] for x in cloned)


def test_the_new_panes_in_chromium_at_1400x900(lowered, tmp_path):
    main_step = next(r for r in lowered.trace.records if r.rule == "cb-main")
    page = tmp_path / "steps.html"
    assert main(["trace", "single_dim", "--stages", "2", "--html", str(page)]) == 0
    dom = chromium(page, "--dump-dom", step=main_step.step).stdout
    assert Dom(dom).errors == {"hidden": True, "text": ""}
    assert 'id="legend"' in dom and 'id="search"' in dom and 'id="codebar"' in dom
    assert f"CUDA after step {main_step.step}" in dom and 'class="after-step"' in dom
    node = re.search(r'<div id="node" data-node="(\d+)">(.*?)</div></div>', dom, re.S)
    assert node and int(node.group(1)) == main_step.created[0] and node.group(2).count('class="attr"') >= 3
    assert "first inserted at" in dom or "built at" in dom
    shots = Path(os.environ.get("CBRULES_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "viewer-single_dim-1400x900.png"
    run = chromium(page, "--window-size=1400,900", f"--screenshot={shot}", step=main_step.step)
    assert run.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
