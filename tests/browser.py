"""Headless Chromium checks shared by the report tests."""

from __future__ import annotations

import json
import re
import shutil
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
# The layout is measured as the page opens (its <details> collapsed); the images and SVGs
# with every <details> opened, so that those inside one are checked too.
PROBE = """<script>
window.addEventListener("load", function () {
  var box = function (el) {
    if (!el) { return null; }
    var r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width};
  };
  var headers = Array.prototype.slice.call(document.querySelectorAll("#metric-table th"));
  var layout = {
    viewport: window.innerWidth,
    page_width: document.documentElement.scrollWidth,
    page_height: document.documentElement.scrollHeight,
    headers: headers.map(function (th) { return [th.textContent.trim(), box(th)]; }),
    table_box: box(document.getElementById("metric-table-scroll")),
    closed_details: Array.prototype.filter.call(document.querySelectorAll("details"),
      function (d) { return !d.open; }).map(function (d) { return d.id; })
  };
  Array.prototype.forEach.call(document.querySelectorAll("details"),
    function (d) { d.open = true; });
  var imgs = Array.prototype.slice.call(document.images);
  var out = {
    loaded: true,
    layout: layout,
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


def probe(html_path: Path, workdir: Path, width: int = 1280) -> dict:
    """Load ``html_path`` in Chromium, ``width`` pixels wide; return what loaded, which
    errors and images, and the layout (``layout``: the metrics table's header boxes)."""
    html = html_path.read_text(encoding="utf-8")
    page = workdir / "probe.html"
    head = html.index("<head>") + len("<head>")
    body_end = html.rindex("</body>")
    page.write_text(
        html[:head] + CATCH + html[head:body_end] + PROBE + html[body_end:], encoding="utf-8"
    )
    run = chromium(
        [f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        workdir / "profile-dom",
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


def screenshot(
    html_path: Path, shot: Path, workdir: Path, width: int = 1280, height: int = 4200
) -> None:
    """Render ``html_path`` to the PNG ``shot``, a window of ``width`` x ``height`` pixels."""
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    run = chromium(
        [f"--window-size={width},{height}", f"--screenshot={shot}", html_path.as_uri()],
        workdir / f"profile-shot-{width}",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


PDFTOTEXT = shutil.which("pdftotext")
PDF_SKIP_REASON = "the printed-report check needs poppler-utils (apt-get install -y poppler-utils)"


def print_pdf(html_path: Path, pdf: Path, workdir: Path) -> None:
    """Print ``html_path`` to ``pdf`` as Chromium prints it (the page's print styles)."""
    pdf.parent.mkdir(parents=True, exist_ok=True)
    pdf.unlink(missing_ok=True)
    run = chromium(
        ["--no-pdf-header-footer", f"--print-to-pdf={pdf}", html_path.as_uri()],
        workdir / "profile-pdf",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert pdf.read_bytes().startswith(b"%PDF")


def pdf_pages(pdf: Path) -> list[str]:
    """The text of each page of ``pdf`` (``pdftotext -layout``), only what lies on the page.

    The text is cropped to each page's size (``pdfinfo``), so a column drawn past the
    page's edge, where no printer puts it, does not count as printed.
    """
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    size = re.search(r"Page size:\s+([\d.]+) x ([\d.]+) pts", info)
    assert size, info
    width, height = (int(float(v)) for v in size.groups())
    text = subprocess.run(
        [
            "pdftotext",
            "-layout",
            "-r",
            "72",
            "-x",
            "0",
            "-y",
            "0",
            "-W",
            str(width),
            "-H",
            str(height),
            str(pdf),
            "-",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return text.split("\f")[:-1] if text.endswith("\f") else text.split("\f")


def pdf_page_image(pdf: Path, page: int, out_prefix: Path) -> Path:
    """Page ``page`` (1-based) of ``pdf`` as a PNG (``pdftoppm``), for a person to look at."""
    subprocess.run(
        [
            "pdftoppm",
            "-png",
            "-r",
            "70",
            "-f",
            str(page),
            "-l",
            str(page),
            "-singlefile",
            str(pdf),
            str(out_prefix),
        ],
        check=True,
        capture_output=True,
    )
    return out_prefix.with_suffix(".png")
