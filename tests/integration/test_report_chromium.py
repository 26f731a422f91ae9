"""report.html of a 64-node x 8-GPU results set (a real cpu-local run fanned out, one slow GPU and
one failed port planted), opened in real headless Chromium at 1400x900: the first screen names
the slow GPU's node and GPU and the failed port, each with its next action.

What is "on the first screen" is measured by Chromium's own layout: a copy of the report gets a
script that collects the text of every rendered text node whose box lies within the 1400x900
viewport (folded <details> content is not rendered: ``checkVisibility``) and writes it into the DOM, which ``--dump-dom``
prints. A screenshot of the same page is taken too.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

with contextlib.suppress(ImportError):  # see tests/unit/test_report.py: numpy must not load twice
    import matplotlib.figure  # noqa: F401

from pytest_gpucluster.results.baseline import read_results
from pytest_gpucluster.results.report import write_reports
from pytest_gpucluster.testbed.chromium import CHROMIUM, headless_flags
from pytest_gpucluster.testbed.fanout import dumps, fan_out

REAL_RUN = Path(__file__).parents[1] / "data" / "results" / "cpu_local_run.json"
WIDTH, HEIGHT = 1400, 900
FLAGS = headless_flags(WIDTH, HEIGHT)
FIRST_SCREEN_SCRIPT = """
<script>
(function () {
  var out = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  var range = document.createRange(), node;
  while ((node = walker.nextNode())) {
    if (!node.textContent.trim()) continue;
    var el = node.parentElement;  // folded <details> content keeps its boxes but is not rendered
    if (el.checkVisibility && !el.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true})) continue;
    var folded = el.closest('details:not([open])');
    if (folded && !el.closest('summary')) continue;
    range.selectNodeContents(node);
    var rects = range.getClientRects();
    for (var i = 0; i < rects.length; i++) {
      var r = rects[i];
      if (r.width > 0 && r.height > 0 && r.top < window.innerHeight && r.bottom > 0 && r.left < window.innerWidth) {
        out.push(node.textContent.trim()); break;
      }
    }
  }
  var pre = document.createElement('pre');
  pre.id = 'first-screen';
  pre.setAttribute('data-viewport', window.innerWidth + 'x' + window.innerHeight);
  pre.textContent = out.join('\\n');
  document.body.appendChild(pre);
})();
</script>
"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    argv = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (apt-get install -y chromium)")
def test_the_first_screen_names_the_planted_gpu_and_port_with_their_actions(tmp_path):
    fanned, planted = fan_out(json.loads(REAL_RUN.read_text()), 64)
    results = tmp_path / "run" / "results.json"
    results.parent.mkdir()
    results.write_text(dumps(fanned))
    files = write_reports(read_results(results), results.parent)
    probe = results.parent / "first-screen.html"
    probe.write_text(files.html.read_text().replace("</body>", FIRST_SCREEN_SCRIPT + "</body>"))

    dumped = _chromium(tmp_path, "--dump-dom", probe.as_uri())
    assert 'id="first-screen"' in dumped.stdout, f"no DOM from chromium: {dumped.stderr[-2000:]}"
    viewport = dumped.stdout.split('data-viewport="', 1)[1].split('"', 1)[0]
    width, height = map(int, viewport.split("x"))
    # --dump-dom lays the page out in the window less its frame (1400x757 with chromium 13x): a
    # first screen no larger than 1400x900, so what it shows a 1400x900 screenshot shows too
    assert width == WIDTH and 600 <= height <= HEIGHT
    first = dumped.stdout.split('id="first-screen"', 1)[1].split(">", 1)[1].split("</pre>", 1)[0]
    first = first.replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")

    assert first.startswith("GPU cluster acceptance report\nNOT FIT")
    assert f"{planted.slow_node}\n" in first and f"{planted.port_node}\n" in first
    assert f"GPU {planted.slow_gpu}: {planted.slow_metric}" in first and "-> reset GPU" in first
    assert f"{planted.port}: {planted.port_metric}" in first and "-> reseat/replace cable or NIC" in first
    # the findings table, with the host/GPU and host/port and their actions, is on the first screen too
    assert f"{planted.slow_node}, GPU {planted.slow_gpu}" in first
    assert f"{planted.port_node}, {planted.port}" in first
    # a healthy node is folded away, one click from the first screen
    assert "node001\n" not in first and "62 more node(s) where every area passed" in first

    shot = tmp_path / "shot.png"
    taken = _chromium(tmp_path, f"--screenshot={shot}", files.html.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000, f"no screenshot: {taken.stderr[-2000:]}"
