"""Screenshot a `ragen2 report` page in headless Chromium, to check by eye what a browser shows.

The page is rendered in a window `--width` CSS pixels wide and `--height` tall, and the blank
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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    """The first Chromium-family binary on PATH."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    raise SystemExit(f"no Chromium found on PATH (tried {', '.join(BROWSERS)}); on Debian: apt-get install chromium")


def screenshot(page: Path, out: Path, width: int, height: int, scale: float, timeout: float = 120.0) -> None:
    """Render `page` and write the raw screenshot to `out`."""
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no first-run state, no lock on a shared one
        cmd = [
            find_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--allow-file-access-from-files", f"--user-data-dir={profile}", f"--window-size={width},{height}",
            f"--force-device-scale-factor={scale}", f"--screenshot={out.resolve()}", page.resolve().as_uri(),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.expand:
        # A copy next to the page, so that its relative figure paths still resolve.
        with tempfile.NamedTemporaryFile("w", suffix=".html", dir=args.page.parent, encoding="utf-8") as copy:
            copy.write(args.page.read_text(encoding="utf-8").replace("<details>", "<details open>"))
            copy.flush()
            screenshot(Path(copy.name), args.out, args.width, args.height, args.scale)
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
