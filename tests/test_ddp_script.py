"""Notebook 04's grader, on scripts run for real under torchrun: it passes a correct DDP script and
fails broken ones (without set_epoch, without DDP); the sampler's shares make the course's global
batches; the mistakes are edits of the last step; the exercise's solution is that step."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from helpers.experiments.ddp_script import (
    MISTAKES,
    STEPS,
    TEMPLATES,
    ScriptFailed,
    checkpoint_weights,
    copy_templates,
    grade,
    reference_batches,
    run_script,
    template,
    with_mistake,
)
from helpers.notebook.tools import read, skeleton

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "04_your_own_ddp_script.ipynb"
N_TRAIN, GLOBAL_BATCH, EPOCHS = 1024, 256, 2  # 4 steps an epoch, 8 in all
# Rounding alone moved notebook 04's 56-step runs by 3e-8 between 1 and 2 workers; the mistakes
# below move these 8 steps by far more than this (a different training from the first step
# they change on).
ATOL = 1e-5


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    """The templates, a run of each mistake's script, and a small data file (random rows: the
    grader checks what a script did, not what it learnt)."""
    folder = tmp_path_factory.mktemp("ddp_script")
    paths = copy_templates(folder)
    for mistake in MISTAKES:
        paths[mistake] = folder / f"{mistake.replace(' ', '_')}.py"
        paths[mistake].write_text(with_mistake(template("ddp_har"), mistake))
    g = torch.Generator().manual_seed(0)
    np.savez(
        folder / "data.npz",
        X_train=torch.randn(N_TRAIN, 561, generator=g).numpy(),
        y_train=torch.randint(0, 6, (N_TRAIN,), generator=g).numpy(),
        X_test=torch.randn(101, 561, generator=g).numpy(),
        y_test=torch.randint(0, 6, (101,), generator=g).numpy(),
    )
    paths["data"] = folder / "data.npz"
    return paths


def train(scripts: dict[str, Path], name: str, world: int | None, tmp: Path):
    args = ["--data", str(scripts["data"]), "--epochs", str(EPOCHS),
            "--global-batch", str(GLOBAL_BATCH), "--out", str(tmp / name)]  # fmt: skip
    return run_script(scripts[name], args, tmp / name, world, timeout=240).check()


@pytest.fixture(scope="module")
def one_process(scripts, tmp_path_factory) -> np.ndarray:
    run = train(scripts, "step0_one_process", None, tmp_path_factory.mktemp("one"))
    return checkpoint_weights(run)


def verdict(scripts, name, one_process, tmp_path) -> dict[str, bool]:
    run = train(scripts, name, 2, tmp_path)
    return grade(run, N_TRAIN, GLOBAL_BATCH, EPOCHS, one_process, one_process, atol=ATOL)


@pytest.mark.slow
def test_the_grader_passes_a_correct_ddp_script(scripts, one_process, tmp_path):
    assert verdict(scripts, "ddp_har", one_process, tmp_path) == {
        "one writer": True,
        "only rank 0 prints": True,
        "each sample once": True,
        "new order each epoch": True,
        "reference's batches": True,
        "= 1 process": True,
        "= reference": True,
    }


@pytest.mark.slow
def test_the_grader_fails_a_script_without_set_epoch(scripts, one_process, tmp_path):
    failed = {k for k, ok in verdict(scripts, "forgotten set_epoch", one_process, tmp_path).items()
              if not ok}  # fmt: skip
    assert failed == {"new order each epoch", "reference's batches", "= 1 process", "= reference"}


@pytest.mark.slow
def test_the_grader_fails_a_script_without_ddp(scripts, one_process, tmp_path):
    """Step 2 splits the data right, and its workers never average: rank 0's weights are its own
    model's, not the one-process training's."""
    failed = {k for k, ok in verdict(scripts, "step2_sampler", one_process, tmp_path).items()
              if not ok}  # fmt: skip
    assert failed == {"= 1 process", "= reference"}


@pytest.mark.slow
def test_a_failing_rank_is_reported_in_one_line(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise SystemExit('rank one gives up')\n"
        "dist.destroy_process_group()\n"
    )
    with pytest.raises(ScriptFailed, match="rank 1: rank one gives up"):
        run_script(script, [], tmp_path / "run", world=2, timeout=120).check()


@pytest.mark.slow
def test_a_rank_that_aborts_is_reported(tmp_path):
    """A worker killed by SIGABRT (as by "terminate called without an active exception" at
    teardown) fails the run, and the report names that rank."""
    script = tmp_path / "aborts.py"
    script.write_text(
        "import os\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "rank = dist.get_rank()\n"
        "dist.destroy_process_group()\n"
        "if rank == 1:\n"
        "    os.write(2, b'terminate called without an active exception\\n')\n"
        "    os.abort()\n"
    )
    run = run_script(script, [], tmp_path / "run", world=2, timeout=120)
    assert run.returncode != 0
    with pytest.raises(ScriptFailed, match="rank 1: terminate called without an active exception"):
        run.check()


@pytest.mark.slow
def test_a_run_past_its_timeout_leaves_no_worker_behind(tmp_path):
    """torchrun is told to stop (SIGTERM), and stops its workers before run_script raises."""
    script = tmp_path / "hangs.py"
    script.write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "Path(sys.argv[1], f'pid{os.environ[\"RANK\"]}').write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(ScriptFailed, match="did not finish within 40 s"):
        run_script(script, [str(tmp_path)], tmp_path / "run", world=2, timeout=40)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    if not pids:
        pytest.skip("the workers had not started within 40 s (a busy machine): nothing to check")
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"workers {alive} outlived the run"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_run_script_clears_only_its_own_folders(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a run")
    with pytest.raises(ValueError, match="did not write"):
        run_script(tmp_path / "any.py", [], mine)
    assert (mine / "notes.txt").exists()
    with pytest.raises(ValueError, match="at least 1"):
        run_script(tmp_path / "any.py", [], tmp_path / "other", world=0)
    with pytest.raises(ValueError, match="threads_per_worker"):
        run_script(tmp_path / "any.py", [], tmp_path / "other", threads_per_worker=0)


def test_run_script_gives_the_threads_asked_for(tmp_path, monkeypatch):
    """A bit-for-bit comparison needs the other training's threads, whatever the cores; the
    command it shows sets the variables the script got, so that pasted into a shell it repeats
    the run."""
    script = tmp_path / "threads.py"
    script.write_text(
        "import os\nprint(f\"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} "
        "GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']}\")\n"
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    run = run_script(script, [], tmp_path / "run", threads_per_worker=3)
    assert run.returncode == 0 and run.stdout[0].strip().startswith("OMP_NUM_THREADS=3 ")
    assert run.rerun == f"{run.stdout[0].strip()} {run.shown}"
    assert run.shown.startswith("python ") and "OMP_NUM_THREADS" not in run.shown


@pytest.mark.parametrize("world", [1, 2, 4])
def test_distributed_sampler_shares_make_the_course_global_batches(world: int):
    """With one seed, rank r's i-th batch of B / N rows holds the positions r + N j of the
    epoch's permutation: together, the course's i-th global batch (contiguous positions)."""
    n = 1001  # does not split evenly: the sampler drops a row or two, the loader a last batch
    batches = reference_batches(n, GLOBAL_BATCH, EPOCHS).view(EPOCHS, -1, GLOBAL_BATCH)
    local = GLOBAL_BATCH // world
    for epoch in range(EPOCHS):
        for seeds in ([0] * world, list(range(world))):
            shares = []
            for rank, seed in enumerate(seeds):
                sampler = DistributedSampler(range(n), world, rank, seed=seed, drop_last=True)
                sampler.set_epoch(epoch)
                shares.append(torch.tensor(list(sampler)))
            for i, batch in enumerate(batches[epoch]):
                together = torch.cat([s[i * local : (i + 1) * local] for s in shares])
                same = torch.equal(together.sort().values, batch.sort().values)
                assert same == (len(set(seeds)) == 1), (epoch, seeds, i)


def test_every_mistake_is_an_edit_of_the_last_step():
    last = template("ddp_har")
    for mistake in MISTAKES:
        broken = with_mistake(last, mistake)
        assert broken != last
        ast.parse(broken)  # still a script that runs
    with pytest.raises(ValueError, match="no mistake"):
        with_mistake(last, "typo")
    with pytest.raises(ValueError, match="does not contain"):
        with_mistake(template(STEPS[0]), "forgotten set_epoch")
    with pytest.raises(ValueError, match="no template"):
        template("step9")


def _writefile(nb, target: str) -> str:
    cells = [c.source for c in nb.cells if c.source.startswith(f"%%writefile {target}\n")]
    assert len(cells) == 1, f"one cell writes {target}"
    return cells[0].split("\n", 1)[1]


def test_the_exercise_solution_is_the_last_step_and_its_skeleton_blanks_the_key_lines():
    """The full edition's script is the template the notebook grades (to the comments), and the
    student edition leaves out every line that makes it a DDP script."""
    solution = _writefile(read(NOTEBOOK), "scripts/ddp_har.py")
    assert ast.dump(ast.parse(solution)) == ast.dump(ast.parse(template("ddp_har")))
    blank = skeleton(solution)
    assert blank is not None
    for key in ("init_process_group(", "get_world_size(", "DistributedSampler(", "set_epoch(",
                "DDP(", "module.state_dict(", "destroy_process_group("):  # fmt: skip
        assert key in solution and key not in blank, key


def test_every_script_that_joins_a_group_ends_normally():
    """The scripts a reader copies end as a script of their own should: destroy_process_group,
    then a normal return, so that atexit handlers (a tracker's end of run, a profiler's export)
    and non-daemon threads (an upload) finish. None skips the teardown with os._exit, the
    workaround helpers.train keeps for an abort it measured in its own runs."""
    nb = read(NOTEBOOK)
    scripts = {p.name: p.read_text() for p in TEMPLATES.glob("*.py")}
    for name in ("ddp_har.py", "evaluate.py"):  # the exercises', as the notebook writes them
        scripts[f"notebook's {name}"] = _writefile(nb, f"scripts/{name}")
    joining = {name: text for name, text in scripts.items() if "init_process_group(" in text}
    assert len(joining) == 6, sorted(joining)
    for name, text in joining.items():
        assert "os._exit" not in text, name
        assert "destroy_process_group()" in text, name
        tail = text[text.index('if __name__ == "__main__":') :]
        assert tail.split() == ['if', '__name__', '==', '"__main__":', 'main()'], name
