"""The built documentation, opened in a real browser with no network.

The HTML pages are built (incrementally, into ``docs/_build/html``, the directory ``make docs``
uses; or taken from ``$FBANDS_DOCS_HTML`` when that names a built tree), then one headless
Chromium opens a small harness page next to them that loads every page in turn in an iframe,
lets its scripts run (MathJax typesets the formulas), and records for each page:

* the text still showing a TeX delimiter ``\\(``, ``\\)``, ``\\[``, ``\\]`` or ``$$``, or a TeX
  command such as ``\\frac``, outside code blocks (a formula the renderer did not typeset,
  e.g. because it could not be loaded, or one broken in the source);
* the images that did not load;
* whether the page asked for any script or stylesheet over http(s) (the docs must work offline).

The browser runs with every host name unresolvable, so the check holds on a machine that does
have a network.

Chromium is the Debian package ``chromium`` (``scripts/bootstrap.sh`` installs it when the
docs extra is set up as root). Without it the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HARNESS = "_browser_check.html"

pytestmark = pytest.mark.slow

#: What the harness does in the browser: open each page, wait for MathJax, inspect it.
_HARNESS_SCRIPT = r"""
const pages = %(pages)s;
const results = {};
const frame = document.getElementById("f");
const DELIMS = ["\\(", "\\)", "\\[", "\\]", "$$"];
// A TeX command left in the visible text: a formula that was not typeset (or a broken one).
const TEX = new RegExp("\\\\(" + [
  "frac", "tfrac", "dfrac", "lvert", "rvert", "log", "delta", "epsilon", "varepsilon", "pi",
  "mathrm", "text", "sqrt", "le", "ge", "infty", "bar", "ast", "cdot", "big", "Big", "left",
  "right", "hat", "mathcal",
].join("|") + ")(?![A-Za-z])");
function sleep(ms) { return new Promise(r => setTimeout(r, ms)); }
function loaded() { return new Promise(r => { frame.onload = () => r(); }); }
async function check(page) {
  const done = loaded();
  frame.src = page;
  await Promise.race([done, sleep(15000)]);
  const win = frame.contentWindow, doc = frame.contentDocument;
  const math = doc.querySelector("script[src*='mathjax'], script[src*='katex']") !== null;
  for (let i = 0; i < 60 && math; i++) {   // MathJax 3: its start-up promise settles
    if (win.MathJax && win.MathJax.startup && win.MathJax.startup.promise) {
      try { await win.MathJax.startup.promise; } catch (e) {}
      break;
    }
    await sleep(50);
  }
  await sleep(100);
  const body = doc.body.cloneNode(true);
  body.querySelectorAll("pre, code, script, style, textarea, mjx-assistive-mml")
      .forEach(n => n.remove());
  const text = body.textContent;
  const raw = [];
  for (const d of DELIMS) {
    let i = text.indexOf(d);
    if (i >= 0) raw.push(text.slice(Math.max(0, i - 40), i + 40).replace(/\s+/g, " "));
  }
  const m = TEX.exec(text);
  if (m) raw.push(text.slice(Math.max(0, m.index - 40), m.index + 40).replace(/\s+/g, " "));
  const badImages = [];
  for (const img of doc.images) {
    if (!img.complete || img.naturalWidth === 0) badImages.push(img.getAttribute("src"));
  }
  const remote = [];
  for (const el of doc.querySelectorAll("script[src], link[rel=stylesheet][href]")) {
    const url = el.getAttribute("src") || el.getAttribute("href");
    if (/^(https?:)?\/\//.test(url)) remote.push(url);
  }
  const typeset = doc.querySelectorAll("mjx-container, .katex").length;
  return {raw, badImages, remote, math, typeset, images: doc.images.length};
}
(async () => {
  for (const page of pages) {
    try { results[page] = await check(page); }
    catch (e) { results[page] = {error: String(e)}; }
    document.getElementById("progress").textContent = Object.keys(results).join(" ");
  }
  const out = document.getElementById("out");
  out.textContent = JSON.stringify(results);
  out.setAttribute("data-done", "1");
})();
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def html_dir() -> Path:
    given = os.environ.get("FBANDS_DOCS_HTML")
    if given:
        out = Path(given)
        assert (out / "index.html").is_file(), f"FBANDS_DOCS_HTML={given} holds no built docs"
        return out
    out = DOCS / "_build" / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
           str(DOCS), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"the docs do not build:\n{proc.stderr[-4000:]}"
    return out


def _pages(html: Path) -> list[str]:
    skip = {HARNESS, "genindex.html", "search.html"}
    return sorted(
        p.relative_to(html).as_posix()
        for p in html.rglob("*.html")
        if p.name not in skip
        and not p.relative_to(html).parts[0].startswith("_")
    )


@pytest.fixture(scope="module")
def browser_report(html_dir: Path) -> dict:
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/bootstrap.sh installs it as root)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pages = _pages(html_dir)
    assert "index.html" in pages and any(p.startswith("theory/") for p in pages)
    harness = html_dir / HARNESS
    harness.write_text(
        "<!doctype html><html><body><iframe id='f' style='width:1200px;height:900px'></iframe>"
        "<pre id='progress'></pre><pre id='out'></pre><script>"
        + _HARNESS_SCRIPT % {"pages": json.dumps(pages)}
        + "</script></body></html>",
        encoding="utf-8",
    )
    cmd = [
        chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
        "--allow-file-access-from-files", "--disable-web-security",
        # No network: every host name fails to resolve, so a remote script cannot load.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--virtual-time-budget={30000 + 6000 * len(pages)}",
        "--dump-dom", harness.as_uri(),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        harness.unlink(missing_ok=True)
    match = re.search(r'<pre id="out" data-done="1">(.*?)</pre>', proc.stdout, re.S)
    if not match:
        progress = re.search(r'<pre id="progress">(.*?)</pre>', proc.stdout, re.S)
        checked = progress.group(1) if progress else "(nothing)"
        pytest.fail(f"the harness did not finish; pages checked: {checked}\n"
                    f"chromium exited {proc.returncode}: {proc.stderr[-1500:]}")
    import html as html_module

    report = json.loads(html_module.unescape(match.group(1)))
    assert set(report) == set(pages)
    return report


def test_every_formula_is_rendered_offline(browser_report):
    errors = {p: r["error"] for p, r in browser_report.items() if "error" in r}
    assert not errors, errors
    raw = {p: r["raw"] for p, r in browser_report.items() if r["raw"]}
    assert not raw, f"pages showing unrendered TeX: {raw}"
    remote = {p: r["remote"] for p, r in browser_report.items() if r["remote"]}
    assert not remote, f"pages loading scripts or styles over the network: {remote}"
    # The check above is empty-handed if nothing was typeset: the theory pages must be.
    for page in ("index.html", "theory/band.html", "theory/limits.html"):
        assert browser_report[page]["typeset"] > 0, f"no typeset formula on {page}"


def test_every_image_loads(browser_report):
    bad = {p: r["badImages"] for p, r in browser_report.items() if r["badImages"]}
    assert not bad, f"images that do not load: {bad}"
    assert browser_report["index.html"]["images"] >= 1
