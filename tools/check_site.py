"""Opens every page of a built documentation site in headless Chromium and checks how it reads.

    python -m sphinx -n -W --keep-going -b html docs SITE
    python tools/check_site.py SITE --shots SHOTS_DIR

It builds nothing.  Each page is loaded in Chromium (the distribution's
``chromium`` package: ``apt-get install -y chromium``) at 1280x1000, with a
small script added to a copy of the page that measures it once it has
loaded; ``chromium --headless --dump-dom`` returns the measurements.  A page
fails when:

- it scrolls horizontally (the document is wider than the window), or an
  element of its content column (a table, an image, a block) reaches past
  that column's right edge, or a table is wider than its column and scrolls
  inside it;
- a code block is wider than the content column (its lines scroll), unless
  it marks the lines it is about and every marked line is fully visible
  without scrolling: a line highlighted by ``:emphasize-lines:`` (Pygments'
  ``hll``), or one whose comment ends with a marker such as ``# (1)``.  A
  block that marks nothing must fit whole;
- an image does not load;
- raw markup shows in its text (outside code): a MyST role such as
  ``{doc}`` or ``{py:func}``, a directive fence, or a literal backtick;
- it is taller than ``--max-height`` pixels (default 12,000: twelve
  screens at this size).  The longest page that reads well, the training
  guide, is about 8,400 px: each of its sections is one topic a reader
  looks up.  A page past 12,000 px is several pages in one, as the old
  Examples page (32,700 px, nine whole scripts) was.  A how-to page that a
  user reads before using a feature has its own, lower limit
  (``PAGE_HEIGHTS``): the ``amax_scaler`` guide at most 3,200 px, its
  study's tables on a runs page of their own.  Highlighted source listings
  (``_modules/``) and the generated index pages are not checked.

Every ``<details>`` is opened before the measuring: what a reader can
unfold must fit too.  The widths are measured, not estimated: each code
block's ``scrollWidth`` against its ``clientWidth``, each marked line's
right edge (a DOM Range over its text) against the block's visible right
edge.

Screenshots of the main pages (the top of each, up to 3,000 px) go into
``--shots``.  Exit status 1 when a page fails, with one line per problem.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import html
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

WIDTH, HEIGHT = 1280, 1000
MAIN_PAGES = [
    "guide/amax-scaler.html",
    "index.html",
    "install.html",
    "loss-scaling.html",
    "guide/training.html",
    "guide/nnx.html",
    "troubleshooting.html",
    "faq.html",
    "examples.html",
    "support.html",
    "contract.html",
    "bench-results.html",
    "why.html",
    "glossary.html",
    "api/optax.html",
    "api/operator.html",
    "api/training.html",
    "backends.html",
    "ascend.html",
]
SKIP_DIRS = {"_static", "_sources", "_modules", "_downloads", "_images", ".doctrees"}
# How-to pages read in minutes: their own height limit, in px.
PAGE_HEIGHTS = {"guide/amax-scaler.html": 3200}

SKIP_PAGES = {"genindex.html", "search.html", "py-modindex.html"}

# Runs in the page once it has loaded (and its images have settled); leaves
# its findings on <html data-site-check="...">, which --dump-dom returns.
PROBE = r"""
<script>
window.addEventListener("load", () => setTimeout(() => {
  // What a reader can unfold must fit too: measure every <details> open.
  for (const d of document.querySelectorAll("details")) d.open = true;
  const out = {problems: [], height: document.documentElement.scrollHeight};
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth + 1) {
    out.problems.push(`the page scrolls horizontally: ${doc.scrollWidth} px wide in a ${window.innerWidth} px window`);
  }
  const column = document.querySelector("div.content") || document.querySelector("article[role=main]") || document.body;
  const right = column.getBoundingClientRect().right;
  const label = (el) => {
    const id = el.id || (el.closest("[id]") || {}).id || "";
    return `<${el.tagName.toLowerCase()}${el.className ? " class=" + el.className : ""}>${id ? " near #" + id : ""}`;
  };
  const scrolls = (el) => {
    for (let p = el.parentElement; p && p !== column; p = p.parentElement) {
      const s = getComputedStyle(p).overflowX;
      if (s === "auto" || s === "scroll" || s === "hidden") return p;
    }
    return null;
  };
  // Code blocks: a block whose lines scroll fails, unless it marks lines
  // (emphasize-lines, or a "# (1)" marker at a line's end) and every
  // marked line is fully visible without scrolling.
  const MARKER = /(#|\/\/)[^\n]*\(\d+\)\s*$/;
  for (const pre of column.querySelectorAll("pre")) {
    if (pre.getBoundingClientRect().width === 0) continue;
    if (pre.scrollWidth <= pre.clientWidth + 2) continue;
    const box = pre.getBoundingClientRect();
    const visible = box.left + pre.clientLeft + pre.clientWidth;
    // Each line's text nodes, and whether it is marked.
    const lines = [{nodes: [], marked: false, text: ""}];
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const hll = !!(node.parentElement && node.parentElement.closest(".hll"));
      const parts = node.data.split("\n");
      parts.forEach((part, i) => {
        if (i > 0) lines.push({nodes: [], marked: false, text: ""});
        const line = lines[lines.length - 1];
        const start = parts.slice(0, i).reduce((n, s) => n + s.length + 1, 0);
        if (part.length) line.nodes.push([node, start, start + part.length]);
        line.text += part;
        if (hll && part.trim()) line.marked = true;
      });
    }
    const where = label(pre.closest("div[class*=highlight-]") || pre);
    const marked = lines.filter((l) => l.marked || MARKER.test(l.text));
    if (!marked.length) {
      out.problems.push(`a code block is ${pre.scrollWidth} px wide in a ${pre.clientWidth} px column and marks no line (${where}): "${lines.reduce((a, l) => l.text.length > a.length ? l.text : a, "").trim().slice(0, 60)}"`);
      continue;
    }
    for (const line of marked) {
      let right = 0;
      for (const [node, a, b] of line.nodes) {
        const range = document.createRange();
        range.setStart(node, a);
        range.setEnd(node, b);
        for (const rect of range.getClientRects()) right = Math.max(right, rect.right);
      }
      const text = line.text.replace(/\s+$/, "");
      if (right > visible + 1 && text.length) {
        out.problems.push(`a marked line of a code block runs ${Math.round(right - visible)} px past its visible edge (${where}): "${text.trim().slice(0, 60)}"`);
      }
    }
  }
  for (const el of column.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || el.closest("pre, .highlight")) continue;
    if (el.tagName === "TABLE") {
      const box = scrolls(el);
      const room = box ? box.clientWidth : column.clientWidth;
      if (el.scrollWidth > room + 2) {
        out.problems.push(`a table is ${el.scrollWidth} px wide in a ${room} px column (${label(el)})`);
        continue;
      }
    }
    if (r.right > right + 2 && !scrolls(el)) {
      out.problems.push(`${label(el)} reaches ${Math.round(r.right - right)} px past the content column`);
    }
  }
  for (const img of document.images) {
    if (!img.complete || img.naturalWidth === 0) {
      out.problems.push(`an image does not load: ${img.getAttribute("src")}`);
    }
  }
  const clone = column.cloneNode(true);
  for (const el of clone.querySelectorAll("pre, code, .highlight, script, style, kbd, samp, tt")) el.remove();
  const text = clone.textContent;
  const raw = [/\{(doc|ref|py:\w+|download|image|include|literalinclude|toctree|code-block|eval-rst|list-table)\}/,
               /^\s*(```|:::)/m, /`/];
  for (const re of raw) {
    const m = text.match(re);
    if (m) {
      const at = Math.max(0, m.index - 40);
      out.problems.push(`raw markup shows: "${text.slice(at, m.index + 40).replace(/\s+/g, " ").trim()}"`);
    }
  }
  document.documentElement.setAttribute("data-site-check", JSON.stringify(out));
}, 300));
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("no chromium on PATH: apt-get install -y chromium")


def browse(browser: str, url: str, *extra: str, height: int = HEIGHT) -> str:
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", "--disable-extensions", "--allow-file-access-from-files",
        f"--window-size={WIDTH},{height}", "--virtual-time-budget=10000", *extra, url,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed on {url}: {done.stderr[-2000:]}")
    return done.stdout


def check_page(browser: str, copy: pathlib.Path, page: pathlib.Path) -> dict:
    text = page.read_text()
    page.write_text(text.replace("</body>", PROBE + "</body>", 1))
    dom = browse(browser, page.as_uri(), "--dump-dom")
    m = re.search(r'data-site-check="([^"]*)"', dom)
    if m is None:
        return {"problems": ["the page's measurements did not come back (did it load?)"]}
    return json.loads(html.unescape(m.group(1)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=pathlib.Path, help="a built HTML site (sphinx -b html)")
    ap.add_argument("--shots", type=pathlib.Path, required=True, help="folder for screenshots")
    ap.add_argument("--max-height", type=int, default=12_000, help="tallest page, in px")
    ap.add_argument("--jobs", type=int, default=2, help="pages checked at once")
    args = ap.parse_args()
    site = args.site.resolve()
    if not (site / "index.html").exists():
        sys.exit(f"{site} has no index.html: build the site first")
    browser = chromium()
    args.shots.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    heights: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="site-check-") as tmp:
        copy = pathlib.Path(tmp) / "site"
        shutil.copytree(site, copy, ignore=shutil.ignore_patterns(".doctrees"))
        pages = sorted(
            p
            for p in copy.rglob("*.html")
            if not (set(p.relative_to(copy).parts[:-1]) & SKIP_DIRS) and p.name not in SKIP_PAGES
        )
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = dict(
                zip(pages, pool.map(lambda p: check_page(browser, copy, p), pages), strict=True)
            )
        for page, result in results.items():
            name = str(page.relative_to(copy))
            heights[name] = result.get("height", 0)
            problems = list(dict.fromkeys(result["problems"]))
            limit = PAGE_HEIGHTS.get(name, args.max_height)
            if heights[name] > limit:
                problems.append(f"{heights[name]} px tall (at most {limit})")
            failures += [f"{name}: {p}" for p in problems]
        # Screenshots of the main pages, from the original site (no probe).
        for name in MAIN_PAGES:
            page = site / name
            if not page.exists():
                failures.append(f"{name}: a main page is missing")
                continue
            height = min(max(heights.get(name, HEIGHT), HEIGHT), 3000)
            shot = args.shots / (name.replace("/", "_").removesuffix(".html") + ".png")
            browse(browser, page.as_uri(), f"--screenshot={shot}", height=height)
    tallest = sorted(heights.items(), key=lambda kv: -kv[1])[:5]
    print(f"checked {len(heights)} pages at {WIDTH}x{HEIGHT}; the tallest:")
    for name, h in tallest:
        print(f"  {h:6d} px  {name}")
    print(f"screenshots of {len(MAIN_PAGES)} main pages in {args.shots}")
    if failures:
        print(f"\n{len(failures)} problem(s):")
        print("\n".join(failures))
        return 1
    print("every page passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
