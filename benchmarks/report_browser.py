"""Open workflow reports in headless Chromium, as the report tests do (issue 15).

The test suite opens the reports of the tiny runs; a report of an atlas-sized run
(``workflow_scale.py`` at 1M samples) is checked here with the same probe
(``tests/browser.py``): the page loads, every image decodes and is shown, no script or
resource error, nothing fetched. One line per report, and a screenshot beside each
(``<report>.png`` under ``--shots``).

    .venv/bin/python benchmarks/report_browser.py \
        benchmarks/out/workflow_scale/n1000000/results/sim/report.html

Needs Debian's ``/usr/bin/chromium`` (``apt-get install -y chromium``). Exit status 1 when
a report fails the probe.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from browser import CHROMIUM, SKIP_REASON, probe, screenshot  # noqa: E402


def check(report: Path, shots: Path) -> tuple[bool, str]:
    html = report.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        result = probe(report, Path(tmp))
        shot = shots / f"{report.parent.name}-{report.stem}.png"
        screenshot(report, shot, Path(tmp))
    fetched = [r for r in result["resources"] if not r.startswith("data:")]
    ok = (
        "<script" not in html.lower()  # the report itself carries no JavaScript
        and result.get("loaded") is True
        and "Uncaught" not in result["stderr"]
        and not result["errors"]
        and not result["broken"]
        and result["shown"] == result["images"] == html.count("<img ")
        and result["svgs_shown"] == result["svgs"]
        and not fetched
    )
    line = (
        f"{'ok' if ok else 'FAILED'} {report} ({report.stat().st_size / 1e6:.2f} MB): "
        f"{result['images']} images, {result['shown']} shown, broken {result['broken']}, "
        f"{result['svgs_shown']}/{result['svgs']} svgs shown, errors {result['errors']}, "
        f"fetched {fetched}; screenshot {shot}"
    )
    return ok, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--shots", type=Path, default=ROOT / "benchmarks" / "out" / "browser")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(SKIP_REASON)
    results = [check(report.resolve(), args.shots) for report in args.reports]
    for _, line in results:
        print(line)
    sys.exit(0 if all(ok for ok, _ in results) else 1)


if __name__ == "__main__":
    main()
