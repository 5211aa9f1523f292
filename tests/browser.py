"""Headless Chromium checks shared by the report tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # nothing may be fetched from the network: an external resource would fail to load
    "--host-resolver-rules=MAP * ~NOTFOUND",
]

SKIP_REASON = "headless browser check needs /usr/bin/chromium (apt-get install -y chromium)"

# Installed first in <head>: record every error (script errors and failed resource loads).
CATCH = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  var t = e.target;
  window.__errors.push(t && t !== window ? "resource: " + (t.src || t.href || t.tagName)
                                         : "js: " + e.message);
}, true);
</script>"""

# Installed last in <body>: on load, write what we check into the DOM for --dump-dom.
PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var out = {
    loaded: true,
    errors: window.__errors,
    images: imgs.length,
    broken: imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; })
                .map(function (i) { return i.alt; }),
    shown: imgs.filter(function (i) { return i.getBoundingClientRect().width > 0; }).length,
    svgs: document.querySelectorAll("svg").length,
    svgs_shown: Array.prototype.filter.call(document.querySelectorAll("svg"), function (s) {
      var box = s.getBoundingClientRect();
      return box.width > 0 && box.height > 0;
    }).length,
    resources: performance.getEntriesByType("resource").map(function (r) { return r.name; }),
    title: document.title
  };
  var pre = document.createElement("pre");
  pre.id = "probe-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium(args: list[str], profile: Path, timeout: int = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def probe(html_path: Path, workdir: Path) -> dict:
    """Load ``html_path`` in Chromium; return what loaded, which errors and images."""
    html = html_path.read_text(encoding="utf-8")
    page = workdir / "probe.html"
    head = html.index("<head>") + len("<head>")
    body_end = html.rindex("</body>")
    page.write_text(
        html[:head] + CATCH + html[head:body_end] + PROBE + html[body_end:], encoding="utf-8"
    )
    run = chromium(
        ["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], workdir / "profile-dom"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', run.stdout, re.S)
    assert match, f"the page did not finish loading; stderr: {run.stderr[-2000:]}"
    result = json.loads(
        match.group(1)
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", '"')
        .replace("&amp;", "&")
    )
    result["stderr"] = run.stderr
    return result


def screenshot(html_path: Path, shot: Path, workdir: Path) -> None:
    """Render ``html_path`` to the PNG ``shot``."""
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    run = chromium(
        ["--window-size=1280,4200", f"--screenshot={shot}", html_path.as_uri()],
        workdir / "profile-shot",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
