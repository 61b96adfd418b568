"""Screenshots of report pages, as an auditor's browser shows them: headless Chromium
renders each page at 1100 px wide, and the blank below the page is trimmed.

    python docs/report/screenshots.py PAGE.html OUT.png [PAGE.html OUT.png ...]

``make report-images`` runs it on the demo's and the DP demo's reports. Chromium must be
installed (Debian: ``apt-get install chromium``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH, TALL = 1100, 8000


def shoot(page: Path, out: Path) -> None:
    """Render ``page`` to ``out`` (PNG), trimmed to the page's content."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("screenshots: no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{TALL}",
                f"--screenshot={out.resolve()}",
                page.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
        )
    from PIL import Image

    with Image.open(out) as image:
        rgb = image.convert("RGB")
        inverted = Image.eval(rgb, lambda v: 255 - v)  # white is 0: the box of what is not white
        box = inverted.getbbox()
        if box is not None:
            rgb.crop((0, 0, WIDTH, min(box[3] + 24, rgb.height))).save(out, optimize=True)


def main(argv: list[str]) -> None:
    if not argv or len(argv) % 2:
        sys.exit(__doc__)
    for page, out in zip(argv[::2], argv[1::2], strict=True):
        shoot(Path(page), Path(out))
        print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
