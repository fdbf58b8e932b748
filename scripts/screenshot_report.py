"""The README's picture of the HTML report: converts a zoo model with
``--html``, opens the page in headless chromium (Debian's, as the tests do)
and saves a screenshot.

    .venv/bin/python scripts/screenshot_report.py [--model vit] [--level O2] [--out docs/report.png]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AMP = str(Path(sys.executable).with_name("amp-convert"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit", help="zoo model name (models/zoo/NAME.onnx)")
    parser.add_argument("--level", default="O2")
    parser.add_argument("--out", default=str(ROOT / "docs" / "report.png"))
    parser.add_argument("--width", type=int, default=1150)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium: `make browser` installs Debian's")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        page_path = Path(folder) / "report.html"
        model = ROOT / "models" / "zoo" / f"{args.model}.onnx"
        cmd = [AMP, str(model), "--level", args.level, "-o", str(Path(folder) / "out.onnx"), "--html", str(page_path), "-q"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not page_path.is_file():
            sys.exit(f"amp-convert wrote no report (exit {proc.returncode}): {proc.stderr.strip()}")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto(page_path.as_uri())
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    print(f"wrote {args.out} ({' '.join(cmd[1:])}: exit {proc.returncode})")


if __name__ == "__main__":
    main()
