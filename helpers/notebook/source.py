"""The PyTorch calls a helper makes, printed from its source as it stands in helpers/: a page that
shows them cannot drift from the code that ran."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def show(fn: Callable, first: str, last: str) -> None:
    """Print the lines of ``fn``'s source from the one holding ``first`` to the one holding
    ``last``, and on until the brackets opened there are closed (a call written over several
    lines). Raises ``ValueError`` if either text is not in the source."""
    lines = inspect.getsource(fn).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if first in line)
        end = next(i for i, line in enumerate(lines) if last in line and i >= start)
    except StopIteration:
        raise ValueError(
            f"{fn.__qualname__}'s source has no line with {first!r} followed by {last!r}"
        ) from None
    shown = lines[start : end + 1]
    while _open_brackets(shown) > 0 and end + 1 < len(lines):
        end += 1
        shown.append(lines[end])
    print("\n".join(shown))


def _open_brackets(lines: list[str]) -> int:
    text = "\n".join(line.split("  #")[0] for line in lines)  # comments may hold brackets
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
