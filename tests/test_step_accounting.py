"""Notebook 08's split of a step's time (compute, collectives alone, the rest) and its count of
the minor page faults each step takes."""

import os

import pytest
import torch
from fakes import run_result

from helpers.experiments.step_accounting import (
    median_step_faults,
    minor_faults,
    step_accounting,
    why_no_page_count,
)


def _run(sync: str, step_s: float, replay_s: float | None, faults: list[int]):
    probes = [{"step_seconds": step_s, "replay_seconds": replay_s, "step_minor_faults": f}
              for f in faults]  # fmt: skip
    return run_result(sync=sync, world=len(faults), probes=probes)


def test_a_step_splits_into_the_compute_its_collectives_and_the_rest():
    launch = [_run("none", 0.020, None, [0, 0]), _run("ddp", 0.030, 0.006, [10, 12]),
              _run("fsdp2", 0.050, 0.018, [900, 950])]  # fmt: skip
    table = step_accounting({"defaults": launch})
    fsdp = table.loc[("defaults", "FSDP2, 2 workers")]
    assert fsdp["compute ms"] == pytest.approx(20.0)
    assert fsdp["collectives alone ms"] == pytest.approx(18.0)
    assert fsdp["left ms"] == pytest.approx(50.0 - 20.0 - 18.0)
    assert (fsdp["faults per step, fewest rank"], fsdp["faults per step, most"]) == (900, 950)
    assert list(table.index.get_level_values("run")) == ["DDP, 2 workers", "FSDP2, 2 workers"]


def test_a_launch_without_a_training_alone_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="sync='none'"):
        step_accounting({"defaults": [_run("ddp", 0.03, 0.006, [1, 1])]})


def test_the_median_faults_per_step_leave_out_the_first_step():
    # marks at the start and after each of 4 steps: 100 faults in the first, then 5, 7, 6
    assert median_step_faults([0, 100, 105, 112, 118]) == 6
    assert median_step_faults([0, 100]) is None  # one step: nothing after the first


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or why_no_page_count() is not None,
                    reason="faults that count 4 KiB pages: Linux without huge pages always on")
def test_touching_fresh_memory_counts_minor_faults():
    before = minor_faults()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB: mmapped fresh by glibc, then touched
    after = minor_faults()
    assert block.sum() > 0
    assert after - before >= 0.5 * block.numel() * 4 / os.sysconf("SC_PAGE_SIZE")


def test_faults_count_pages_unless_huge_pages_are_always_on(tmp_path):
    thp = tmp_path / "enabled"
    thp.write_text("always [madvise] never\n")
    assert why_no_page_count(thp) is None
    thp.write_text("[always] madvise never\n")
    assert "huge pages are always on" in why_no_page_count(thp)
    assert why_no_page_count(tmp_path / "absent") is None
