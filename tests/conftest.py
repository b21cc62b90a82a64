import sys
from pathlib import Path

import pytest

# tests/workers.py holds worker functions that spawned processes import by name
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def namespaces() -> None:
    """Skip, with the reason, where this process cannot create network namespaces. Checked when
    a test asks for it, not when the tests are collected: the check creates a namespace."""
    from helpers.dist.netns import why_no_namespaces

    why = why_no_namespaces()
    if why is not None:
        pytest.skip(why)
