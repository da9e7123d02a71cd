"""Open a page in headless Chromium: its screenshot, its DOM, and what its console said."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
from matplotlib.image import imread

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


def render(page: Path, tmp_path: Path, size: tuple[int, int] = (1200, 2600)):
    """Returns (RGB screenshot array, DOM text, console error lines)."""
    shot = tmp_path / "page.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
              "--disable-background-networking", "--disable-component-update",
              "--no-first-run"]  # fmt: skip
    run = subprocess.run(
        [*common, f"--window-size={size[0]},{size[1]}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    return np.asarray(imread(shot))[..., :3], dom, console
