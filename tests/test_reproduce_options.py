"""python -m helpers.reproduce: --lr and --seed as in TrainConfig, and the printed rerun command."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import reproduce
from helpers.dist.cores import CORES_ENV
from helpers.reproduce import main, parse_args, rerun_line
from helpers.training import RunResult, TrainConfig


def test_lr_and_seed_default_to_the_reference_experiment():
    args = parse_args([])
    assert (args.lr, args.seed) == (TrainConfig.lr, TrainConfig.seed)


@pytest.mark.parametrize("bad", [["--lr", "0"], ["--lr", "-0.1"], ["--lr", "nan"], ["--seed", "x"]])
def test_bad_lr_or_seed_is_refused_in_one_line(bad, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(bad)
    assert stop.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--workers", "1", "2", "--global-batch", "512", "2048", "--epochs", "3", "--lr", "0.1"],
        ["--seed", "7", "--oversubscribe", "--data", "standin", "--threads-per-worker", "2"],
    ],
)
def test_the_rerun_command_parses_back_to_the_same_run(argv, monkeypatch):
    monkeypatch.delenv(CORES_ENV, raising=False)
    args = parse_args(argv)
    words = shlex.split(rerun_line(args, "standin", 2))
    assert words[:3] == ["python", "-m", "helpers.reproduce"]
    again = parse_args(words[3:])
    assert again == parse_args([*argv, "--data", "standin", "--threads-per-worker", "2"])


def test_the_rerun_command_names_the_core_cap(monkeypatch):
    monkeypatch.setenv(CORES_ENV, "2")
    rerun = rerun_line(parse_args([]), "standin", 1)
    assert rerun.startswith(f"{CORES_ENV}=2 python -m ")


def test_lr_and_seed_reach_the_training_and_the_rerun_line(monkeypatch, capsys):
    configs = []

    def fake_run(world, config, threads, oversubscribed):
        configs.append(config)
        return RunResult(world, config.global_batch, config.epochs, threads, 1.0, 0.1, 0.5, True,
                         [0.0] * world, [0.5] * world, 1, config.data)  # fmt: skip

    monkeypatch.setattr(reproduce, "run_training", fake_run)
    monkeypatch.delenv(CORES_ENV, raising=False)
    argv = ["--workers", "1", "--global-batch", "1024", "--epochs", "1", "--lr", "0.2"]
    assert main([*argv, "--seed", "3", "--data", "standin", "--threads-per-worker", "1"]) == 0
    assert [(c.lr, c.seed) for c in configs] == [(0.2, 3)]
    out = capsys.readouterr().out
    assert "SGD lr 0.2," in out
    assert f"rerun: python -m helpers.reproduce {shlex.join(argv)} --seed 3 --data standin" in out


@pytest.mark.slow
def test_the_printed_command_reruns_the_result():
    """End to end, one worker, 3 steps: the printed command gives the same weights again."""

    def run(*argv: str) -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "helpers.reproduce", *argv],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        rerun = next(line for line in done.stdout.splitlines() if line.startswith("rerun: "))
        row = next(line for line in done.stdout.splitlines() if line.split()[:1] == ["1"])
        return rerun.removeprefix("rerun: "), row.split()[-1]  # the weights' checksum

    first = run(
        "--workers", "1", "--global-batch", "2048", "--epochs", "1", "--seed", "5",
        "--data", "standin",
    )  # fmt: skip
    words = shlex.split(first[0])  # the environment (DDP_COURSE_CORES=2 under make test) is ours
    assert run(*words[words.index("helpers.reproduce") + 1 :]) == first


def test_the_processes_tests_start_load_named_data_outside_the_repository():
    """As the run above: a child process of a test loads what conftest.py names, from the
    session's folder, so that no test tries the network ("auto") or writes into har/."""
    code = "import helpers.data as d; print(d.resolve_source()); print(d.resolve_root())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    source, root = done.stdout.splitlines()
    assert source != "auto"
    assert not Path(root).resolve().is_relative_to(Path(__file__).resolve().parents[1])


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["helpers.reproduce", "helpers.train"])
def test_a_bad_core_cap_is_one_line_in_both_command_lines(entry, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", entry, "--global-batch", "4096", "--data", "standin"],
        env={**os.environ, CORES_ENV: "two", "HAR_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: {CORES_ENV} must be a whole number of cores, at least 1; got 'two'"
    )


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["helpers.reproduce", "helpers.train"])
def test_help_is_plain_text_that_says_what_runs(entry):
    done = subprocess.run(
        [sys.executable, "-m", entry, "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout and ":py:" not in done.stdout  # no reStructuredText
    says = {
        "helpers.reproduce": ["Experiment 1: the same training", "Experiment 2: speed-up"],
        "helpers.train": ["torchrun --standalone --nproc-per-node 2 -m helpers.train"],
    }
    assert all(words in done.stdout for words in says[entry]), done.stdout
