"""What a student's script does, read from its text: for a grader that must rule out a shortcut
its results cannot show. Notebook 03's exercise 3 asks for DDP's two jobs written by hand; a
script that wraps the model in DDP ends with the same weights, so only its text tells them apart.
Read with ``ast``, so that layout, comments and aliases do not matter."""

from __future__ import annotations

import ast

WRAPPERS = frozenset({"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP",
                      "fully_shard"})  # fmt: skip


def _dotted(node: ast.expr) -> str:
    """``torch.distributed.broadcast`` for that chain of attributes; ``?`` for what is not a
    name (a call's result, a subscript)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


def _mentions_rank(node: ast.AST) -> bool:
    """Whether an expression uses a name or attribute with ``rank`` in it (``rank``,
    ``seed + rank``, ``dist.get_rank()``)."""
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if isinstance(name, str) and "rank" in name.lower():
            return True
    return False


def by_hand_problems(source: str, name: str = "the script") -> list[str]:
    """What keeps ``source`` from doing DDP's two jobs itself from a per-rank seed: a DDP or
    FSDP wrapper used anywhere, no ``broadcast`` call, no ``all_reduce`` call, or no
    ``manual_seed`` whose argument depends on the rank. Empty when none."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return [f"{name} does not parse: {error.msg} (line {error.lineno})"]
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute):
            used.add(_dotted(node).rsplit(".", 1)[-1])
        elif isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
    calls = [(_dotted(n.func).rsplit(".", 1)[-1], n) for n in ast.walk(tree)
             if isinstance(n, ast.Call)]  # fmt: skip
    called = {last for last, _ in calls}
    problems = []
    if wrappers := sorted(used & WRAPPERS):
        problems.append(f"{name} uses {', '.join(wrappers)}: write DDP's two jobs by hand")
    if not called & {"broadcast", "broadcast_object_list"}:
        problems.append(f"{name} calls no broadcast: rank 0's weights never reach the others")
    if "all_reduce" not in called:
        problems.append(f"{name} calls no all_reduce: the gradients are never averaged")
    seeds = [call for last, call in calls if last == "manual_seed"]
    if not any(_mentions_rank(arg) for call in seeds for arg in [*call.args, *call.keywords]):
        problems.append(f"{name} has no manual_seed that depends on the rank (mistake (a))")
    return problems
