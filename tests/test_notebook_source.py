"""``show`` prints a helper's lines as they stand, a call over several lines whole."""

from __future__ import annotations

import pytest

from helpers.notebook.source import show


def _sample(store, rank):  # noqa: ANN001, ANN202 - a source to read, never called
    before = 1
    group = dict(  # a comment (with a bracket
        backend="gloo",
        store=store,
        rank=rank,
    )
    after = 2
    return before, group, after


def test_prints_from_first_to_last_and_closes_an_open_call(capsys):
    show(_sample, "group = dict(", "group = dict(")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].strip().startswith("group = dict(") and printed[-1].strip() == ")"
    assert len(printed) == 5


def test_a_text_not_in_the_source_is_a_one_line_error():
    with pytest.raises(ValueError, match="_sample's source has no line with 'missing'"):
        show(_sample, "missing", "after")
