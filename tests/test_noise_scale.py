"""The gradient noise scale estimator (McCandlish et al. 2018, Appendix A) on problems whose
noise scale is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.experiments.noise_scale import measure_noise_scale, noise_scale_from_norms


def test_the_estimator_recovers_a_known_noise_scale():
    # per-sample gradients G + noise, noise covariance sigma^2 I in d dimensions:
    # tr(Sigma) = d sigma^2, B_simple = d sigma^2 / |G|^2 = 50 * 4 / 8 = 25
    rng = np.random.default_rng(0)
    d, sigma, small, workers = 50, 2.0, 8, 8
    G = np.full(d, np.sqrt(8.0 / d))
    small_sq, big_sq = [], []
    for _ in range(400):
        samples = G + sigma * rng.standard_normal((workers, small, d))
        local = samples.mean(axis=1)
        small_sq.append(float((local**2).sum(axis=1).mean()))
        big_sq.append(float((local.mean(axis=0) ** 2).sum()))
    ns = noise_scale_from_norms(small_sq, big_sq, small, small * workers)
    assert ns.grad_sq == pytest.approx(8.0, rel=0.1)
    assert ns.trace == pytest.approx(d * sigma**2, rel=0.05)
    assert ns.b_simple == pytest.approx(25.0, rel=0.15)


def test_the_estimator_is_exact_on_its_expected_norms():
    # E|g_B|^2 = |G|^2 + tr(Sigma) / B, with |G|^2 = 3 and tr(Sigma) = 60
    ns = noise_scale_from_norms([3 + 60 / 4], [3 + 60 / 32], 4, 32)
    assert (ns.grad_sq, ns.trace, ns.b_simple) == pytest.approx((3.0, 60.0, 20.0))


def test_the_estimator_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="small batch < big batch"):
        noise_scale_from_norms([1.0], [1.0], 8, 8)
    with pytest.raises(ValueError, match="as many"):
        noise_scale_from_norms([1.0, 2.0], [1.0], 4, 8)


def test_measured_on_a_model_it_matches_the_per_sample_gradients():
    # the population values, from every sample's own gradient, against the DDP-style estimate
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(2048, 6, generator=gen)
    y = (X[:, 0] + 0.5 * torch.randn(2048, generator=gen) > 0).long()
    torch.manual_seed(0)
    model = nn.Linear(6, 2)
    per_sample = []
    for i in range(len(X)):
        model.zero_grad()
        F.cross_entropy(model(X[i : i + 1]), y[i : i + 1]).backward()
        per_sample.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    grads = torch.stack(per_sample).double()
    mean = grads.mean(dim=0)
    trace = float(((grads - mean) ** 2).sum(dim=1).mean())
    expected = trace / float(mean.square().sum())
    ns = measure_noise_scale(model, X, y, local_batch=4, workers=4, n_batches=128)
    assert ns.b_simple == pytest.approx(expected, rel=0.25)
    assert ns.n_batches == 128 and ns.big_batch == 16


def test_identical_samples_have_no_gradient_noise():
    X, y = torch.ones(64, 3), torch.zeros(64, dtype=torch.long)
    torch.manual_seed(0)
    ns = measure_noise_scale(nn.Linear(3, 2), X, y, local_batch=2, workers=4, n_batches=8)
    assert abs(ns.b_simple) < 1e-3


def test_measuring_needs_two_workers_and_enough_samples():
    X, y = torch.ones(64, 3), torch.zeros(64, dtype=torch.long)
    with pytest.raises(ValueError, match="2 workers"):
        measure_noise_scale(nn.Linear(3, 2), X, y, local_batch=2, workers=1, n_batches=8)
    with pytest.raises(ValueError, match="need more than"):
        measure_noise_scale(nn.Linear(3, 2), X, y, local_batch=8, workers=4, n_batches=3)
