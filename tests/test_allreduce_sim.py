"""Tests for helpers.notebook.allreduce_sim: the worked example, the two all-reduces, the byte
counts and gradient averaging. The all-reduce tests use integer-valued floats so that any order of
additions gives the exact sum and the comparisons can be exact."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.notebook.allreduce_sim import (
    Transfer,
    adam_first_step,
    allreduce_mean,
    bytes_sent_per_worker,
    chunk_bounds,
    format_vector,
    init_softmax_params,
    make_classification_data,
    naive_allreduce,
    naive_bytes_formula,
    ring_allreduce,
    ring_bytes_formula,
    ring_schedule,
    sgd_step,
    softmax_loss_and_grad,
    split_sizes,
    worker_gradients,
)

# --- the two-worker worked example -------------------------------------------------------------

W = np.array([1.0, -1.0])
G0 = np.array([0.6, -0.2])
G1 = np.array([0.2, 0.4])
LR = 0.1


def test_worked_example_numbers() -> None:
    local0 = sgd_step(W, G0, LR)
    local1 = sgd_step(W, G1, LR)
    mean = allreduce_mean([G0, G1])
    synced = sgd_step(W, mean, LR)
    np.testing.assert_allclose(local0, [0.94, -0.98], atol=1e-15)
    np.testing.assert_allclose(local1, [0.98, -1.04], atol=1e-15)
    np.testing.assert_allclose(mean, [0.4, 0.1], atol=1e-15)
    np.testing.assert_allclose(synced, [0.96, -1.01], atol=1e-15)
    # the second weight: worker 0 alone moves it up, the averaged step moves it down
    assert local0[1] > W[1] > synced[1]
    assert format_vector(local0) == "[0.94, -0.98]"
    assert format_vector(synced) == "[0.96, -1.01]"
    assert format_vector(mean) == "[0.4, 0.1]"


def test_sgd_step_does_not_modify_input() -> None:
    w = W.copy()
    sgd_step(w, G0, LR)
    np.testing.assert_array_equal(w, W)


def test_adam_first_step_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.tensor(W))
    opt = torch.optim.Adam([p], lr=LR)
    p.grad = torch.tensor(G0)
    opt.step()
    np.testing.assert_allclose(adam_first_step(W, G0, LR), p.detach().numpy(), rtol=1e-12)


def test_format_vector_rounds_noise_but_keeps_digits() -> None:
    assert format_vector([0.9400000000000001, -0.0]) == "[0.94, 0.0]"
    assert format_vector([0.123456789]) == "[0.123456789]"
    assert format_vector([1.0, 2.5], decimals=0) == "[1.0, 2.0]"


# --- all-reduce: naive and ring ----------------------------------------------------------------


def _int_buffers(n: int, length: int, dtype: type = np.float64, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, size=length).astype(dtype) for _ in range(n)]


SIZES = [(1, 5), (2, 1), (2, 7), (3, 3), (3, 10), (4, 4), (4, 13), (5, 2), (7, 100), (8, 1001)]


@pytest.mark.parametrize("allreduce", [ring_allreduce, naive_allreduce])
@pytest.mark.parametrize(("n", "length"), SIZES)
def test_allreduce_gives_every_worker_the_sum(allreduce, n: int, length: int) -> None:
    buffers = _int_buffers(n, length)
    originals = [b.copy() for b in buffers]
    expected = np.sum(buffers, axis=0)
    results, _ = allreduce(buffers)
    assert len(results) == n
    for r in results:
        np.testing.assert_array_equal(r, expected)
    for b, o in zip(buffers, originals, strict=True):  # inputs are left alone
        np.testing.assert_array_equal(b, o)


def test_ring_allreduce_random_floats_close_and_identical_across_workers() -> None:
    rng = np.random.default_rng(1)
    buffers = [rng.normal(size=37).astype(np.float32) for _ in range(6)]
    results, _ = ring_allreduce(buffers)
    expected = np.sum(np.stack(buffers).astype(np.float64), axis=0)
    for r in results:
        assert r.dtype == np.float32
        np.testing.assert_allclose(r, expected, rtol=1e-5, atol=1e-5)
        # each chunk is summed once and then copied: every worker holds the very same bits
        np.testing.assert_array_equal(r, results[0])


def test_ring_allreduce_rejects_mismatched_buffers() -> None:
    with pytest.raises(ValueError):
        ring_allreduce([np.zeros(4), np.zeros(5)])
    with pytest.raises(ValueError):
        naive_allreduce([np.zeros(4), np.zeros(4, dtype=np.float32)])


def test_ring_snapshots_show_partial_sums_then_full_sums() -> None:
    # worker i holds 10**i everywhere, so a value's digits say whose contributions it contains
    n = 4
    buffers = [np.full(n, 10.0**i) for i in range(n)]
    snaps: list[list[np.ndarray]] = []
    ring_allreduce(buffers, snapshots=snaps)
    assert len(snaps) == 1 + 2 * (n - 1)
    after_rs = snaps[n - 1]
    for i in range(n):
        # after reduce-scatter, worker i owns the complete chunk (i + 1) mod n
        assert after_rs[i][(i + 1) % n] == 1111.0
        # and none of its other chunks is complete yet
        assert sum(after_rs[i] == 1111.0) == 1
    for buf in snaps[-1]:
        np.testing.assert_array_equal(buf, np.full(n, 1111.0))


def test_chunk_bounds_cover_everything_with_sizes_within_one() -> None:
    for length, n in [(10, 3), (3, 5), (1631238, 8), (12, 4)]:
        bounds = chunk_bounds(length, n)
        assert len(bounds) == n
        assert bounds[0][0] == 0 and bounds[-1][1] == length
        assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        sizes = [hi - lo for lo, hi in bounds]
        assert max(sizes) - min(sizes) <= 1


def test_ring_schedule_every_worker_sends_every_step_to_its_right() -> None:
    n = 5
    _, log = ring_allreduce(_int_buffers(n, 20))
    assert len(log) == 2 * (n - 1) * n
    for t in log:
        assert t.receiver == (t.sender + 1) % n
    grid = ring_schedule(log, n)
    assert len(grid) == 2 * (n - 1)
    # in each phase a worker sends each chunk but one exactly once
    for phase_rows in (grid[: n - 1], grid[n - 1 :]):
        for w in range(n):
            sent = [row[w] for row in phase_rows]
            assert len(set(sent)) == n - 1
    assert {t.phase for t in log} == {"reduce-scatter", "all-gather"}


# --- bytes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("length", [64, 120, 1000, 1003])
def test_ring_bytes_match_formula(n: int, length: int) -> None:
    buffers = _int_buffers(n, length, dtype=np.float32)
    m = buffers[0].nbytes
    _, log = ring_allreduce(buffers)
    sent = bytes_sent_per_worker(log, n)
    formula = ring_bytes_formula(n, m)
    itemsize = buffers[0].itemsize
    if length % n == 0:
        assert np.all(sent == formula)
    else:
        assert np.all(np.abs(sent - formula) < 2 * itemsize)
    # in total every chunk crosses N - 1 links per phase: exactly 2 (N - 1) M
    assert sent.sum() == 2 * (n - 1) * m


def test_ring_bytes_reference_mlp_message() -> None:
    n, m = 4, 6_524_952
    assert ring_bytes_formula(n, m) == 9_787_428
    assert ring_bytes_formula(2, m) == m  # two workers: each sends half, twice
    assert ring_bytes_formula(8, m) == pytest.approx(11_418_666)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_naive_bytes_match_formula(n: int) -> None:
    buffers = _int_buffers(n, 33, dtype=np.float32)
    m = buffers[0].nbytes
    for root in (0, n - 1):
        _, log = naive_allreduce(buffers, root=root)
        sent = bytes_sent_per_worker(log, n)
        root_bytes, other_bytes = naive_bytes_formula(n, m)
        assert sent[root] == root_bytes == (n - 1) * m
        assert all(sent[w] == other_bytes == m for w in range(n) if w != root)


def test_bytes_sent_per_worker_counts_senders() -> None:
    log = [
        Transfer(1, "x", 0, 1, 0, 10),
        Transfer(1, "x", 1, 2, 1, 7),
        Transfer(2, "x", 0, 1, 2, 5),
    ]
    np.testing.assert_array_equal(bytes_sent_per_worker(log, 3), [15, 7, 0])


# --- gradients ---------------------------------------------------------------------------------

N_FEATURES, N_CLASSES = 5, 3


def test_softmax_gradient_matches_finite_differences() -> None:
    x, y = make_classification_data(12, N_FEATURES, N_CLASSES, seed=3)
    params = init_softmax_params(N_FEATURES, N_CLASSES, seed=4)
    _, grad = softmax_loss_and_grad(params, x, y, N_CLASSES)
    eps = 1e-6
    numeric = np.zeros_like(params)
    for k in range(params.size):
        step = np.zeros_like(params)
        step[k] = eps
        plus, _ = softmax_loss_and_grad(params + step, x, y, N_CLASSES)
        minus, _ = softmax_loss_and_grad(params - step, x, y, N_CLASSES)
        numeric[k] = (plus - minus) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_sum_reduction_is_n_times_mean() -> None:
    x, y = make_classification_data(10, N_FEATURES, N_CLASSES)
    params = init_softmax_params(N_FEATURES, N_CLASSES)
    loss_mean, g_mean = softmax_loss_and_grad(params, x, y, N_CLASSES)
    loss_sum, g_sum = softmax_loss_and_grad(params, x, y, N_CLASSES, reduction="sum")
    assert loss_sum == pytest.approx(10 * loss_mean)
    np.testing.assert_allclose(g_sum, 10 * g_mean)


@pytest.mark.parametrize("n_workers", [1, 2, 4, 8])
def test_mean_of_equal_slice_gradients_is_full_batch_gradient(n_workers: int) -> None:
    x, y = make_classification_data(64, N_FEATURES, N_CLASSES)
    params = init_softmax_params(N_FEATURES, N_CLASSES)
    _, full = softmax_loss_and_grad(params, x, y, N_CLASSES)
    grads = worker_gradients(params, x, y, N_CLASSES, split_sizes(64, n_workers))
    assert np.max(np.abs(allreduce_mean(grads) - full)) < 1e-12
    if n_workers > 1:  # the slices really do differ, so the agreement is not an accident
        assert np.max(np.abs(grads[0] - full)) > 1e-3


def test_unequal_slices_plain_mean_is_wrong_size_weighted_mean_is_right() -> None:
    x, y = make_classification_data(64, N_FEATURES, N_CLASSES)
    params = init_softmax_params(N_FEATURES, N_CLASSES)
    _, full = softmax_loss_and_grad(params, x, y, N_CLASSES)
    sizes = [40, 16, 8]
    grads = worker_gradients(params, x, y, N_CLASSES, sizes)
    assert np.max(np.abs(allreduce_mean(grads) - full)) > 1e-3
    weighted = sum(s * g for s, g in zip(sizes, grads, strict=True)) / sum(sizes)
    assert np.max(np.abs(weighted - full)) < 1e-12


def test_split_sizes_and_worker_gradients_validate() -> None:
    assert split_sizes(12, 4) == [3, 3, 3, 3]
    with pytest.raises(ValueError):
        split_sizes(10, 4)
    x, y = make_classification_data(10, N_FEATURES, N_CLASSES)
    params = init_softmax_params(N_FEATURES, N_CLASSES)
    with pytest.raises(ValueError):
        worker_gradients(params, x, y, N_CLASSES, [5, 4])
