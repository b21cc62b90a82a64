"""Collectives between real processes, the send/recv ring all-reduce, and the alpha-beta model."""

from __future__ import annotations

import math
import os

import collective_workers
import numpy as np
import pytest
import torch

from helpers.dist.collectives import collectives_tour, compare_ring_with_allreduce, rank_data
from helpers.dist.collectives import ring_allreduce as ring_allreduce_fn
from helpers.dist.comm_model import (
    DEFAULT_SIZES,
    AlphaBeta,
    fit_alpha_beta,
    measure_allreduce,
    ring_factor,
)
from helpers.dist.launch import WorkerError, launch
from helpers.experiments.split_training import several

# Lengths below, at and above the world size, none of them (except 2 for 2 workers) divisible
# by it, plus one large enough that a message does not fit in a socket buffer.
LENGTHS = [1, 2, 7, 10, 1001, 200_001]
TIMEOUT = 30  # seconds a collective may wait: a deadlocked ring fails in 30 s, not 120
CASES = [(n, torch.float64) for n in LENGTHS] + [(n, torch.int64) for n in LENGTHS[:4]]


@pytest.fixture(scope="module")
def on_workers():
    """The collectives' jobs at a world size, all in one launch (started at the first test that
    asks for that size): the processes and their process group are started once per size."""
    from helpers.dist.collectives import allreduce_in_two_halves

    launched: dict[int, list] = {}

    def at(world: int) -> list:
        if world not in launched:
            jobs = [
                (collective_workers.ring_and_allreduce, (CASES, 7), {}),
                (collectives_tour, (), {}),
            ]
            if world == 2:
                jobs.append((allreduce_in_two_halves, (1000, 0), {}))
            launched[world] = launch(several, world, jobs, collective_timeout=TIMEOUT)
        return launched[world]

    return at


@pytest.mark.parametrize("world", [2, 3])
def test_ring_allreduce_equals_dist_allreduce(world: int, on_workers):
    per_rank = [r[0] for r in on_workers(world)]
    for i, (n, dtype) in enumerate(CASES):
        exact = sum(rank_data(r, n, 7, dtype) for r in range(world))  # computed here, rank order
        ring0 = torch.from_numpy(per_rank[0][i][0])
        assert ring0.shape == (n,) and ring0.dtype == dtype
        for rank in range(world):
            by_ring, by_gloo = (torch.from_numpy(a) for a in per_rank[rank][i])
            assert torch.equal(by_ring, ring0), f"rank {rank} differs from rank 0 (n={n})"
            if dtype == torch.int64 or world == 2:  # integers, or a + b == b + a: exact
                assert torch.equal(by_ring, by_gloo), f"n={n} {dtype} world={world}"
                assert torch.equal(by_ring, exact)
            else:  # three float64 terms: the order of the additions may differ
                torch.testing.assert_close(by_ring, by_gloo, rtol=0, atol=1e-13)
                torch.testing.assert_close(by_ring, exact, rtol=0, atol=1e-13)


@pytest.mark.slow
def test_compare_worker_reports_equality_and_identical_bits():
    two = launch(compare_ring_with_allreduce, 2, 1001, 0, collective_timeout=TIMEOUT)
    assert all(r["equal"] and r["max_abs_diff"] == 0.0 and r["n_different"] == 0 for r in two)
    assert len({r["ring_digest"] for r in two} | {r["allreduce_digest"] for r in two}) == 1
    three = launch(compare_ring_with_allreduce, 3, 1001, 0, collective_timeout=TIMEOUT)
    assert len({r["ring_digest"] for r in three}) == 1  # every rank holds the same bits
    assert all(r["max_abs_diff"] < 1e-12 for r in three)  # sums of 3 normals: |x| < 20


def test_ring_allreduce_refuses_non_contiguous_and_leaves_a_world_of_one_alone():
    with pytest.raises(ValueError, match="contiguous"):
        ring_allreduce_fn(torch.zeros(4, 3).t(), 0, 2)
    t = torch.arange(5.0)
    assert ring_allreduce_fn(t, 0, 1) is t and torch.equal(t, torch.arange(5.0))


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_tour_gives_every_rank_what_each_collective_must(world: int, on_workers):
    tour = [r[1] for r in on_workers(world)]
    for rank, got in enumerate(tour):
        assert got["rank"] == rank and got["world_size"] == world and got["backend"] == "gloo"
        assert got["all_reduce"] == world * (world + 1) / 2
        assert got["broadcast_before"] == ([1.0, 2.0, 3.0] if rank == 0 else [0.0, 0.0, 0.0])
        assert got["broadcast"] == [1.0, 2.0, 3.0]
        assert got["all_gather"] == [10.0 * r for r in range(world)]
        assert got["recv_from_left"] == 100.0 * ((rank - 1) % world)
    pids = {got["pid"] for got in tour}  # one process per rank, none of them this one
    assert len(pids) == world and os.getpid() not in pids


def test_fit_recovers_alpha_and_beta_exactly_without_noise():
    sizes = np.array(DEFAULT_SIZES, dtype=float)
    truth = AlphaBeta(alpha=200e-6, beta=0.8e-9)
    for relative in (True, False):
        fit = fit_alpha_beta(sizes, truth.predict(sizes), relative=relative)
        assert fit.alpha == pytest.approx(truth.alpha, rel=1e-9)
        assert fit.beta == pytest.approx(truth.beta, rel=1e-9)


def test_fit_recovers_alpha_and_beta_from_noisy_times():
    rng = np.random.default_rng(0)
    sizes = np.repeat(np.array(DEFAULT_SIZES, dtype=float), 5)
    truth = AlphaBeta(alpha=200e-6, beta=0.8e-9)
    noisy = truth.predict(sizes) * rng.lognormal(0.0, 0.10, sizes.size)  # 10 % scatter
    fit = fit_alpha_beta(sizes, noisy)
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.10)
    assert fit.beta == pytest.approx(truth.beta, rel=0.10)
    # the same scatter ruins alpha in an absolute fit: large messages' noise swamps it
    absolute = fit_alpha_beta(sizes, noisy, relative=False)
    assert abs(absolute.alpha - truth.alpha) > abs(fit.alpha - truth.alpha)


def test_alpha_beta_model_quantities():
    model = AlphaBeta(alpha=100e-6, beta=1e-9)
    assert model.predict(1_000_000) == pytest.approx(1.1e-3)
    assert np.allclose(model.predict([0, 1e6]), [1e-4, 1.1e-3])
    assert model.bandwidth == pytest.approx(1e9)
    assert model.half_size == pytest.approx(1e5)
    assert [ring_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    assert model.bus_bandwidth(4) == pytest.approx(1.5e9)
    assert "100.0 us" in str(model) and "1.00 GB/s" in str(model)


def test_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="at least 2 points"):
        fit_alpha_beta([4096], [1e-4])
    with pytest.raises(ValueError, match="at least 2 points"):
        fit_alpha_beta([], [])
    with pytest.raises(ValueError, match="2 different message sizes"):
        fit_alpha_beta([4096, 4096], [1e-4, 2e-4])
    with pytest.raises(ValueError, match="positive"):
        fit_alpha_beta([4096, 8192], [1e-4, 0.0])
    with pytest.raises(ValueError, match="2 sizes but 3 times"):
        fit_alpha_beta([4096, 8192], [1e-4, 2e-4, 3e-4])


@pytest.mark.slow
def test_measure_allreduce_times_each_size_for_the_world_sizes_that_fit():
    table = measure_allreduce(world_sizes=[2, 64], sizes=[4096, 65_537], repeats=3, warmup=1)
    assert list(table.columns) == ["world", "bytes", "seconds", "seconds_p25", "seconds_p75"]
    assert table["world"].tolist() == [2, 2]  # 64 workers do not fit: skipped
    assert table["bytes"].tolist() == [4096, 65_536]  # whole float32 elements
    assert all(math.isfinite(s) and 0 < s < 5 for s in table["seconds"])
    assert (table["seconds_p25"] <= table["seconds"]).all()
    assert (table["seconds"] <= table["seconds_p75"]).all()
    assert len(table.attrs["skipped"]) == 1 and "64 workers" in table.attrs["skipped"][0]
    with pytest.raises(ValueError, match="no world size fits"):
        measure_allreduce(world_sizes=[64], sizes=[4096])


def test_reduce_scatter_then_all_gather_is_an_all_reduce(on_workers):
    from helpers.dist.collectives import allreduce_in_two_halves

    rows = [r[2] for r in on_workers(2)]
    assert [r["chunk is the sum's"] for r in rows] == [True, True]
    assert [r["gathered = all_reduce"] for r in rows] == [True, True]
    with pytest.raises(WorkerError, match="multiple of the world size"):
        launch(allreduce_in_two_halves, 2, 1001, 0)
