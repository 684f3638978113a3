"""The built book as a reader sees it: every page of ``_build/html`` opened in headless Chromium with the network
cut off, after ``make book``.

For each page it asserts that MathJax typeset the math (its output elements, ``mjx-container``, present wherever
the page has math), that no raw ``\\(``, ``\\[`` or ``$$`` is left in the visible text, that every image loaded,
that no output cell shows a "Traceback", an "Error" or a warning (``FutureWarning``, ``UserWarning``, ...), that no
table is cut to "..." cells (or a pandas "[N rows x M columns]" footer) and that no table holds only NaN.
Full-page screenshots of a few pages go to ``_build/screenshots/`` for a person to look at (not committed).

    python tests/browser/check_book.py [_build/html]      # exit 1 with one line per problem

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them when missing) and selenium.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCREENSHOTS = ("00_findings", "01_decision_sampling", "03_toy_example", "07_laptop_experiment")
# every host resolves to nothing: the page gets no network (file:// needs none)
NO_NETWORK = "--host-resolver-rules=MAP * ~NOTFOUND"

WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
const start = Date.now();
(function poll() {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { mj.startup.promise.then(() => done("typeset"), e => done("error " + e)); }
  else if (Date.now() - start > 15000) { done("no MathJax"); }
  else { setTimeout(poll, 100); }
})();
"""

INSPECT = """
const text = document.body.innerText;
const outputs = Array.from(document.querySelectorAll('.cell_output, .output')).map(e => e.innerText).join('\\n');
return {
  math: document.querySelectorAll('.math, span.math, div.math').length,
  typeset: document.querySelectorAll('mjx-container').length,
  raw: ['\\\\(', '\\\\[', '$$'].filter(s => text.includes(s)),
  broken_images: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  errors: ['Traceback', 'Error'].filter(s => outputs.includes(s)),
  warnings: (outputs.match(/\\w*Warning\\b[^\\n]{0,80}/g) || []).slice(0, 3),
  cut: Array.from(document.querySelectorAll('.cell_output table td, .cell_output table th, .output table td'))
         .filter(e => { const s = e.innerText.trim(); return s.endsWith('...') || s.endsWith('\\u2026'); }).length
       + (outputs.match(/\\[\\d+ rows x \\d+ columns\\]/g) || []).length,
  nan_tables: Array.from(document.querySelectorAll('.cell_output table, .output table')).filter(t => {
    const cells = Array.from(t.querySelectorAll('td')).map(c => c.innerText.trim());
    return cells.length > 0 && cells.every(c => ['NaN', 'nan', 'None', ''].includes(c));
  }).length,
};
"""


def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", NO_NETWORK,
              "--window-size=1280,1600", "--allow-file-access-from-files"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    d.set_script_timeout(30)
    d.set_page_load_timeout(60)
    return d


def book_pages(html_dir: Path) -> list[Path]:
    """The reader's pages of a built book (not its static files, index or search page)."""
    return sorted(p for p in html_dir.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts
                  and p.name not in ("genindex.html", "search.html"))


def check(html_dir: Path, shots: Path | None = None) -> list[str]:
    """One line per problem found (empty when every page reads as it should)."""
    pages = book_pages(html_dir)
    if not pages:
        return [f"no pages under {html_dir}: run make book first"]
    problems = []
    d = driver()
    try:
        for page in pages:
            name = str(page.relative_to(html_dir))
            d.get(page.resolve().as_uri())
            state = d.execute_async_script(WAIT_FOR_MATHJAX)
            r = d.execute_script(INSPECT)
            if r["math"] and (state != "typeset" or r["typeset"] == 0):
                problems.append(f"{name}: {r['math']} math elements, MathJax {state}, {r['typeset']} typeset")
            if r["raw"]:
                problems.append(f"{name}: raw LaTeX delimiters in the visible text: {r['raw']}")
            if r["broken_images"]:
                problems.append(f"{name}: images that did not load: {r['broken_images'][:3]}")
            if r["errors"]:
                problems.append(f"{name}: an output shows {r['errors']}")
            if r["warnings"]:
                problems.append(f"{name}: an output shows a warning: {r['warnings']}")
            if r["cut"]:
                problems.append(f"{name}: {r['cut']} table cell(s) cut to '...' (show the whole table)")
            if r["nan_tables"]:
                problems.append(f"{name}: {r['nan_tables']} table(s) with nothing but NaN")
            if shots is not None and page.stem in SCREENSHOTS:
                shots.mkdir(parents=True, exist_ok=True)
                height = d.execute_script("return document.body.scrollHeight")
                d.set_window_size(1280, min(max(height, 800), 16000))
                d.save_screenshot(str(shots / f"{page.stem}.png"))
                d.set_window_size(1280, 1600)
    finally:
        d.quit()
    return problems


if __name__ == "__main__":
    html = Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html")
    found = check(html, html.parent / "screenshots")
    for line in found:
        print(f"browser check: {line}")
    print(f"browser check: {len(book_pages(html))} pages, {len(found)} problem(s)")
    sys.exit(1 if found else 0)
