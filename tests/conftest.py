import os
import sys
from pathlib import Path

import pytest

# tests/workers.py holds worker functions that spawned processes import by name
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def session_har_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder for the session: the recordings' cache is built into it at most once and
    shared by every test (and every process a test starts), and the repository's har/ is never
    written."""
    return tmp_path_factory.mktemp("har")


@pytest.fixture(autouse=True)
def har_environment(monkeypatch: pytest.MonkeyPatch, session_har_root: Path) -> None:
    """Every test, and every process it starts, loads named data from the session's folder:
    HAR_ROOT is that folder, and HAR_DATA, unless it names a source already, is the recordings
    (real data, offline), never auto, which would try the network. Set per test, not for the
    session, so that nbval's notebooks (in the same pytest run under `make test`) keep har/ and
    the banners their committed outputs show."""
    monkeypatch.setenv("HAR_ROOT", str(session_har_root))
    if (os.environ.get("HAR_DATA") or "auto").strip().lower() == "auto":
        monkeypatch.setenv("HAR_DATA", "recordings")


@pytest.fixture(autouse=True)
def close_figures():
    """Every figure a test draws is closed after it: pyplot keeps them all otherwise (the
    memory of hundreds, and matplotlib's warning past 20)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture
def namespaces() -> None:
    """Skip, with the reason, where this process cannot create network namespaces. Checked when
    a test asks for it, not when the tests are collected: the check creates a namespace."""
    from helpers.dist.netns import why_no_namespaces

    why = why_no_namespaces()
    if why is not None:
        pytest.skip(why)
