"""Fixtures of the browser tests: one JupyterLab server and one headless Chromium for the module.
`make test-browser` enables the tests by setting DDP_COURSE_BROWSER to the Chromium to drive (a
path, or ``playwright`` for the build that `playwright install chromium` fetched)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from lab_driver import LabServer, alive, launch_browser, listening

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
# Screenshots, kept by the course's workflow as artifacts; results/ is not committed.
SCREENSHOTS = REPO / "results" / "browser"
# As `make test` checks the notebooks: the recordings, planned as on the 2-core reference machine.
CHECKED = {"HAR_DATA": "recordings", "DDP_COURSE_CORES": "2"}


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser to drive, from DDP_COURSE_BROWSER; a missing piece fails in one line."""
    chosen = os.environ.get("DDP_COURSE_BROWSER", "")
    if chosen != "playwright" and not os.access(chosen, os.X_OK):
        pytest.fail(f"DDP_COURSE_BROWSER={chosen!r} is not an executable Chromium", False)
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("playwright is not installed: pip install -r requirements-browser.txt", False)
    if not Path("/proc/self/stat").exists():
        pytest.skip("the browser tests read processes from /proc (Linux only)")
    return chosen


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """The folder JupyterLab serves: copies of the notebooks, so the committed ones stay clean."""
    root = tmp_path_factory.mktemp("lab-root")
    for name in ("01_allreduce_by_hand.ipynb", "03_ddp_on_har.ipynb"):
        shutil.copy(NOTEBOOKS / name, root / name)
    return root


@pytest.fixture(scope="module")
def lab(chromium, lab_root, tmp_path_factory):
    """A `jupyter lab` on 127.0.0.1; stopped with every process it started, even on failure."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**CHECKED, "PYTHONPATH": os.pathsep.join(paths)}  # this checkout's helpers
    server = LabServer(lab_root, tmp_path_factory.mktemp("lab-state"), env)

    def terminated(signum, frame):  # a CI timeout or `kill`: stop as on Ctrl-C, tearing down
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        server.start()
        yield server
    finally:
        signal.signal(signal.SIGTERM, previous)
        port = server.port
        killed = server.stop()
        left = [p for p in killed if alive(p)]
        if killed:
            print(f"killed after the server stopped: {[p.cmdline[:80] for p in killed]}")
        assert not left, f"processes survived SIGKILL: {left}"
        assert not port or not listening(port), f"port {port} still listens after the stop"


@pytest.fixture(scope="module")
def browser(lab, chromium, tmp_path_factory):
    """Headless Chromium with a fresh profile, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):  # the folder holds this run's screenshots only
        old.unlink()
    with sync_playwright() as playwright:
        context = launch_browser(playwright, chromium, tmp_path_factory.mktemp("profile"))
        try:
            yield context
        finally:
            context.close()
