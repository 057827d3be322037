"""report.html opens offline in headless Chromium, with its plots, and without console errors.

Needs Debian's `chromium` (apt-get install -y chromium); skipped, saying so, where it is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from autotune.report.write import write_report
from autotune.study.plan import StudyPlan
from tests.report_studies import BUDGET, infeasible_study, standard_study

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--hide-scrollbars",
]
PLOTS = ("pareto-front", "memory-vs-micro", "phases", "memory-model")
HEADINGS = (
    "The study",
    "Every trial",
    "Pareto front",
    "Peak memory against micro batch size",
    "Time per phase",
    "Memory model",
    "Gain over the hand-made configs",
    "Cost of the study",
)
# Chromium's own background services (time, updates, accounts) may still call home; the page must not.
BROWSER_HOSTS = ("google.com", "googleapis.com", "gstatic.com", "gvt1.com", "chromium.org")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium); CI installs it"
)


def chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )


def console_messages(stderr: str) -> list[str]:
    """Chromium logs the page's console (errors, uncaught exceptions) as `INFO:CONSOLE...` lines."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("html")
    write_report(standard_study(), root / "standard", BUDGET, plan=StudyPlan(model="tiny-llama"))
    write_report(infeasible_study(), root / "none", BUDGET, plan=StudyPlan(model="tiny-llama"))
    return {"standard": root / "standard" / "report.html", "none": root / "none" / "report.html"}


def test_the_page_references_nothing_outside_itself(reports):
    for page in reports.values():
        text = page.read_text()
        assert "<script" not in text.lower()
        refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']|url\(\s*["']?([^)"']*)""", text)
        external = [ref for pair in refs for ref in pair if ref and not ref.startswith(("#", "data:"))]
        assert external == [], external


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["standard", "none"])
def test_renders_with_its_plots_and_no_console_errors(reports, tmp_path, name):
    page = reports[name]
    proc = chromium(page, tmp_path, f"--log-net-log={tmp_path / 'net.json'}", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert console_messages(proc.stderr) == []
    for heading in HEADINGS:
        assert f">{heading}</h2>" in dom, heading
    for plot in PLOTS:
        match = re.search(rf'<svg[^>]*aria-label="{plot}"', dom)
        assert match, plot
    assert dom.count("<path") > 50  # the plots have content, not empty frames
    if name == "none":
        assert "No feasible configuration" in dom and ">What to change</h2>" in dom
    else:
        assert "(chosen)" in dom and "verl_overrides.txt" in dom and ">What to copy</h2>" in dom
    hosts = {
        urlsplit(url).hostname for url in re.findall(r'"url":"([^"]+)"', (tmp_path / "net.json").read_text())
    }
    page_requests = {h for h in hosts if h and not h.endswith(BROWSER_HOSTS)}
    assert page_requests == set()


@pytest.mark.e2e
def test_screenshot_shows_a_drawn_page(reports, tmp_path):
    from PIL import Image  # matplotlib's own dependency

    shot = tmp_path / "report.png"
    proc = chromium(reports["standard"], tmp_path, "--window-size=1200,4000", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    with Image.open(shot) as image:
        assert image.size == (1200, 4000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 200  # text, tables and coloured plots, not a blank page


# Where the page's first screen ends, measured by the browser: a copy of the page with this script appended
# (the report itself carries no script) records each element's box into the DOM that --dump-dom prints.
MEASURE = """<script>
const height = window.innerHeight;
const box = (selector) => {
  const element = document.querySelector(selector);
  if (!element) return "missing";
  const r = element.getBoundingClientRect();
  return r.top >= 0 && r.bottom <= height ? "whole" : "cut at " + Math.round(r.bottom) + " of " + height;
};
document.body.dataset.firstScreen = JSON.stringify(
  {config: box(".copy pre"), launch: box("pre.launch"), gain: box("p.gain"), width: window.innerWidth});
</script>"""


@pytest.mark.e2e
def test_the_first_screen_shows_the_config_the_launch_line_and_the_gain(reports, tmp_path):
    import html
    import json

    page = tmp_path / "measured.html"
    page.write_text(reports["standard"].read_text().replace("</body>", MEASURE + "</body>"))
    proc = chromium(page, tmp_path, "--window-size=1400,900", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'data-first-screen="([^"]+)"', proc.stdout)
    assert found, proc.stdout[:2000]
    boxes = json.loads(html.unescape(found.group(1)))
    assert boxes == {"config": "whole", "launch": "whole", "gain": "whole", "width": 1400}
