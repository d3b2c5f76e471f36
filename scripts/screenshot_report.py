"""Screenshot a `ragen2 report` page in headless Chromium, to check by eye what a browser shows.

First the page is checked (`page_problems`): every figure must load and no script may fail, because
a screenshot of a page with a broken figure would show the report as it is not; the script stops
with the problems instead. tests/test_report.py runs the same check on a report it writes. Then
the page is rendered in a window `--width` CSS pixels wide and `--height` tall, and the blank
rows below the end of the page are cropped, so the default height captures a whole report.
`--scale` renders at that device scale factor (0.5 halves the image's width and height) and
`--colors` quantises to a palette, which keeps a screenshot small enough to commit. `--expand`
opens every collapsible block (the sample trajectories, the configs) before the shot.

    python scripts/screenshot_report.py report-A-vs-B/report.html shot.png
    python scripts/screenshot_report.py runs/RUN/report.html docs/figures/x.png --height 2400 --scale 0.6 --colors 128

Needs a Chromium binary (Debian: `apt-get install chromium`) and Pillow (a matplotlib dependency).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, ImageChops

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    """The first Chromium-family binary on PATH."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    raise SystemExit(f"no Chromium found on PATH (tried {', '.join(BROWSERS)}); on Debian: apt-get install chromium")


# Run first in the page's <head>: it records script errors, console.error calls and elements other than
# images that fail to load, then at the load event every <img> that has no pixels (missing or not an
# image), and appends them as JSON in a <pre> that --dump-dom prints. No <pre> in the dump: the page
# never finished loading.
_CHECK_ID = "ragen2-page-check"
_PROBE = """<script>(() => {
  const problems = [];
  addEventListener("error", (e) => {
    if (e.target instanceof HTMLImageElement) return;  // the load check below names it, with its src
    const el = e.target instanceof Element ? e.target : null;
    problems.push(el ? `${el.tagName.toLowerCase()} did not load: ${el.getAttribute("src") || el.getAttribute("href")}`
                     : `script error: ${e.message} (line ${e.lineno})`);
  }, true);
  addEventListener("unhandledrejection", (e) => problems.push(`unhandled promise rejection: ${e.reason}`));
  const consoleError = console.error;
  console.error = (...args) => { problems.push(`console.error: ${args.join(" ")}`); consoleError(...args); };
  addEventListener("load", () => {
    for (const img of document.images) {
      if (!img.complete || img.naturalWidth === 0) problems.push(`img did not load: ${img.getAttribute("src")}`);
    }
    const out = document.createElement("pre");
    out.id = "%s";
    out.textContent = JSON.stringify(problems);
    document.body.append(out);
  });
})();</script>""" % _CHECK_ID


def _headless(page: Path, flags: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Open `page` in headless Chromium with `flags` (the action: --screenshot=..., --dump-dom) in a fresh
    profile (no first-run state, no lock on a shared one); figures load from the page's directory."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            find_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--allow-file-access-from-files", f"--user-data-dir={profile}", *flags, page.resolve().as_uri(),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@contextmanager
def page_copy(page: Path, text: str) -> Iterator[Path]:
    """A temporary copy of `page` holding `text`, next to it so that its relative figure paths still resolve."""
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, encoding="utf-8") as copy:
        copy.write(text)
        copy.flush()
        yield Path(copy.name)


def page_problems(page: Path, timeout: float = 120.0) -> list[str]:
    """What went wrong when Chromium loaded `page`: images that did not load, script errors, console.error
    calls; [] for a clean page. It loads a copy with `_PROBE` at the top of <head>, after the charset
    declaration (which must stay within the first 1024 bytes)."""
    text = page.read_text(encoding="utf-8")
    head = re.search(r"<head[^>]*>(\s*<meta charset[^>]*>)?", text, flags=re.IGNORECASE)
    if head is None:
        return [f"{page}: no <head> to put the check in"]
    with page_copy(page, text[:head.end()] + _PROBE + text[head.end():]) as probed:
        result = _headless(probed, ["--dump-dom"], timeout)
    found = re.search(rf'<pre id="{_CHECK_ID}">(.*?)</pre>', result.stdout, flags=re.DOTALL)
    if found is None:
        return [f"the page did not finish loading (chromium exited {result.returncode}):\n{result.stderr[-2000:]}"]
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, out: Path, width: int, height: int, scale: float, timeout: float = 120.0) -> None:
    """Render `page` and write the raw screenshot to `out`."""
    flags = [f"--window-size={width},{height}", f"--force-device-scale-factor={scale}", f"--screenshot={out.resolve()}"]
    result = _headless(page, flags, timeout)
    if result.returncode != 0 or not out.exists():
        raise SystemExit(f"chromium failed ({result.returncode}):\n{result.stderr[-2000:]}")


def crop_blank_bottom(image: Image.Image, margin: int = 16) -> Image.Image:
    """Cut the rows below the last non-background pixel (the background is the bottom-left pixel's colour)."""
    rgb = image.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((0, rgb.height - 1)))
    box = ImageChops.difference(rgb, background).getbbox()
    return rgb if box is None else rgb.crop((0, 0, rgb.width, min(rgb.height, box[3] + margin)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="report.html to render")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--width", type=int, default=1400, help="window width in CSS pixels (default 1400)")
    parser.add_argument("--height", type=int, default=12000,
                        help="window height in CSS pixels; the page below it is cut (default 12000)")
    parser.add_argument("--scale", type=float, default=1.0, help="device scale factor (default 1)")
    parser.add_argument("--colors", type=int, default=0, help="quantise to this many colours (default 0: keep RGB)")
    parser.add_argument("--expand", action="store_true", help="open every <details> block first")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        raise SystemExit(f"{args.page}: no such file")
    if problems := page_problems(args.page):
        raise SystemExit(f"{args.page} does not render cleanly:\n" + "\n".join(f"  {p}" for p in problems))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.expand:
        with page_copy(args.page, args.page.read_text(encoding="utf-8").replace("<details>", "<details open>")) as copy:
            screenshot(copy, args.out, args.width, args.height, args.scale)
    else:
        screenshot(args.page, args.out, args.width, args.height, args.scale)
    image = crop_blank_bottom(Image.open(args.out))
    if args.colors:
        image = image.quantize(colors=args.colors, method=Image.Quantize.MEDIANCUT)
    image.save(args.out, optimize=True)
    print(f"wrote {args.out} ({image.width}x{image.height}, {args.out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
