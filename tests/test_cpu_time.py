"""A process's own /proc/<pid>/stat line, read past its command name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.dist.cpu_time import process_stat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_a_command_name_with_spaces_and_parentheses_leaves_the_fields_in_place(tmp_path):
    named = tmp_path / "a (b) c"
    named.symlink_to(sys.executable)
    child = subprocess.Popen([str(named), "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        fields = process_stat(child.pid)
        assert fields is not None and fields[0] in "RSD"  # the state, field 3
        assert int(fields[1]) == os.getpid()  # field 4, the parent: this process
    finally:
        child.communicate(b"")
    assert process_stat(child.pid) is None  # reaped: gone
