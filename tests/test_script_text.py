"""helpers.notebook.script_text: notebook 03's exercise 3 read from its text, so that wrapping
the model in DDP cannot pass for the two jobs written by hand."""

from __future__ import annotations

import pytest

from helpers.notebook.script_text import by_hand_problems

BY_HAND = '''
import torch
import torch.distributed as dist

def train(rank, world_size, data_source):
    torch.manual_seed(rank)  # mistake (a), on purpose
    model = make_mlp()
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size
'''


def test_the_solution_and_its_rewordings_pass():
    assert by_hand_problems(BY_HAND) == []
    reworded = (BY_HAND.replace("import torch.distributed as dist", "from torch import distributed")
                .replace("dist.", "distributed.")
                .replace("torch.manual_seed(rank)", "torch.manual_seed(\n    seed + dist_rank\n)")
                .replace("(p.grad)", "(p.grad, op=distributed.ReduceOp.SUM)"))  # fmt: skip
    assert by_hand_problems(reworded) == []
    assert by_hand_problems(BY_HAND.replace("(rank)", "(dist.get_rank())")) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("    model = make_mlp()", "    model = DDP(make_mlp())"), "uses DDP"),
        (("import torch\n", "from torch.nn.parallel import DistributedDataParallel\n"),
         "uses DistributedDataParallel"),
        (("dist.broadcast(p, src=0)", "pass"), "no broadcast"),
        (("dist.all_reduce(p.grad)", "pass"), "no all_reduce"),
        (("torch.manual_seed(rank)", "torch.manual_seed(0)"), "no manual_seed"),
        (("torch.manual_seed(rank)", "rank + 1"), "no manual_seed"),
    ],
)
def test_each_shortcut_is_named(change: tuple[str, str], expected: str):
    problems = by_hand_problems(BY_HAND.replace(*change), "by_hand.py")
    assert len(problems) == 1 and expected in problems[0] and "by_hand.py" in problems[0]


def test_a_script_that_does_not_parse_says_where():
    (problem,) = by_hand_problems("def train(:\n", "by_hand.py")
    assert problem.startswith("by_hand.py does not parse") and "line 1" in problem
