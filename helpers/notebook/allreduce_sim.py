"""All-reduce by hand: data-parallel SGD and the collectives behind it, simulated in NumPy.

Nothing here starts a process or touches a network. Each "worker" is just a NumPy buffer in a
list, and a "send" copies a slice of one worker's buffer into another's, while a log records who
sent which chunk to whom and how many bytes it was. That is enough to check two things that
the rest of the course relies on:

* averaging the workers' gradients gives the gradient of the mean loss over the whole batch
  (when the workers hold equal slices of it), so every replica takes the same step;
* a ring all-reduce delivers that sum to every worker while each one sends only
  ``2 (N - 1) / N`` times the message size, instead of the root's ``(N - 1)`` times in the
  naive gather-then-broadcast scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # matplotlib is imported lazily, only by the plotting function
    from matplotlib.axes import Axes

# ---------------------------------------------------------------------------------------------
# Data-parallel SGD in one line each
# ---------------------------------------------------------------------------------------------


def sgd_step(w: np.ndarray, g: np.ndarray, lr: float) -> np.ndarray:
    """One plain SGD step ``w - lr * g`` on a copy of ``w``: what a worker would do on its own."""
    return np.asarray(w, dtype=np.float64) - lr * np.asarray(g, dtype=np.float64)


def adam_first_step(w: np.ndarray, g: np.ndarray, lr: float, eps: float = 1e-8) -> np.ndarray:
    """Adam's first step from zero state (Kingma & Ba 2015), on a copy of ``w``.

    After one step the bias-corrected moments are exactly ``g`` and ``g**2``, so the update is
    ``lr * g / (|g| + eps)``, about ``lr * sign(g)``: not linear in ``g``, so averaging models
    stepped this way differs from stepping with the averaged gradient.
    """
    g = np.asarray(g, dtype=np.float64)
    return np.asarray(w, dtype=np.float64) - lr * g / (np.abs(g) + eps)


def allreduce_mean(grads: Sequence[np.ndarray]) -> np.ndarray:
    """The mean of the workers' gradients: what data parallelism hands every worker.

    This is the *result* of an all-reduce (sum, then divide by the number of workers), computed
    directly; :func:`ring_allreduce` and :func:`naive_allreduce` show how it gets there.
    """
    if len(grads) == 0:
        raise ValueError("need at least one gradient")
    return np.mean(np.stack([np.asarray(g, dtype=np.float64) for g in grads]), axis=0)


def format_vector(v: Sequence[float] | np.ndarray, decimals: int = 10) -> str:
    """Format a vector as ``[0.94, -0.98]``: rounded to hide float noise (0.9400000000000001)."""
    values = [float(round(float(x), decimals)) + 0.0 for x in np.ravel(v)]  # + 0.0: no "-0.0"
    return "[" + ", ".join(repr(x) for x in values) + "]"


# ---------------------------------------------------------------------------------------------
# A small model with analytic gradients: softmax regression
# ---------------------------------------------------------------------------------------------


def make_classification_data(
    n_samples: int, n_features: int, n_classes: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic, roughly separable data (float64 features, int labels) from a fixed seed."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(n_classes, n_features))
    y = rng.integers(0, n_classes, size=n_samples)
    x = centres[y] + rng.normal(size=(n_samples, n_features))
    return x, y


def init_softmax_params(n_features: int, n_classes: int, seed: int = 0) -> np.ndarray:
    """Small random flat parameter vector (weights then biases), the same on every worker."""
    rng = np.random.default_rng(seed)
    return rng.normal(scale=0.1, size=n_features * n_classes + n_classes)


def _unflatten(
    params: np.ndarray, n_features: int, n_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    expected = n_features * n_classes + n_classes
    if params.shape != (expected,):
        raise ValueError(f"params must have shape ({expected},), got {params.shape}")
    w = params[: n_features * n_classes].reshape(n_features, n_classes)
    b = params[n_features * n_classes :]
    return w, b


def softmax_loss_and_grad(
    params: np.ndarray, x: np.ndarray, y: np.ndarray, n_classes: int, reduction: str = "mean"
) -> tuple[float, np.ndarray]:
    """Cross-entropy loss of softmax regression and its gradient, flattened like ``params``.

    ``reduction="mean"`` averages over the samples (what a training loop uses), ``"sum"`` adds
    them up; the sum is what a size-weighted average of per-worker means needs. The gradient is
    the textbook one: ``x.T @ (softmax(x W + b) - onehot(y))`` (divided by n for the mean).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    n, d = x.shape
    w, b = _unflatten(np.asarray(params, dtype=np.float64), d, n_classes)
    logits = x @ w + b
    logits = logits - logits.max(axis=1, keepdims=True)  # for numerical stability only
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(n), y].sum()
    delta = np.exp(log_probs)
    delta[np.arange(n), y] -= 1.0
    grad = np.concatenate([(x.T @ delta).ravel(), delta.sum(axis=0)])
    if reduction == "mean":
        return float(loss / n), grad / n
    return float(loss), grad


def split_sizes(n_samples: int, n_workers: int) -> list[int]:
    """Equal slice sizes for ``n_workers``; raises if the batch does not divide evenly."""
    if n_samples % n_workers:
        raise ValueError(f"{n_samples} samples do not split evenly over {n_workers} workers")
    return [n_samples // n_workers] * n_workers


def worker_gradients(
    params: np.ndarray, x: np.ndarray, y: np.ndarray, n_classes: int, sizes: Sequence[int]
) -> list[np.ndarray]:
    """Each worker's mean-loss gradient on its own consecutive slice of the batch.

    ``sizes`` are the slice sizes, in order; they must add up to the batch size.
    """
    if sum(sizes) != len(x):
        raise ValueError(f"slice sizes {list(sizes)} do not add up to the batch of {len(x)}")
    bounds = np.cumsum([0, *sizes])
    return [
        softmax_loss_and_grad(params, x[lo:hi], y[lo:hi], n_classes)[1]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]


# ---------------------------------------------------------------------------------------------
# All-reduce, simulated: buffers are lists of arrays, every send is logged
# ---------------------------------------------------------------------------------------------


class Transfer(NamedTuple):
    """One message in a simulated collective: at ``step`` (1-based, counted across phases)
    ``sender`` sent ``chunk`` (``None`` = the whole buffer) to ``receiver``."""

    step: int
    phase: str
    sender: int
    receiver: int
    chunk: int | None
    nbytes: int


def _check_buffers(buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(buffers) == 0:
        raise ValueError("need at least one worker")
    arrays = [np.array(b, copy=True).ravel() for b in buffers]  # the caller's data stays intact
    shape, dtype = arrays[0].shape, arrays[0].dtype
    for i, a in enumerate(arrays):
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(f"worker {i} holds {a.shape} {a.dtype}, worker 0 {shape} {dtype}")
    return arrays


def chunk_bounds(length: int, n_chunks: int) -> list[tuple[int, int]]:
    """Split ``length`` elements into ``n_chunks`` contiguous chunks whose sizes differ by at
    most one (like ``np.array_split``): the ring works for any message size, not only multiples
    of the number of workers."""
    sizes = [length // n_chunks + (1 if i < length % n_chunks else 0) for i in range(n_chunks)]
    bounds = np.cumsum([0, *sizes])
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def naive_allreduce(
    buffers: Sequence[np.ndarray], root: int = 0
) -> tuple[list[np.ndarray], list[Transfer]]:
    """Sum-all-reduce by gathering every buffer on ``root``, summing there, then broadcasting.

    Step 1 ("reduce"): every other worker sends its whole buffer to the root, which adds them.
    Step 2 ("broadcast"): the root sends the sum back to each of them. The root therefore sends
    ``(N - 1) * M`` bytes (and receives as many); everyone else sends ``M``.
    Returns each worker's resulting buffer and the log of transfers.
    """
    bufs = _check_buffers(buffers)
    n = len(bufs)
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not one of the {n} workers")
    log: list[Transfer] = []
    total = bufs[root].copy()
    for w in range(n):
        if w != root:
            message = bufs[w].copy()  # what travels over the wire
            log.append(Transfer(1, "reduce", w, root, None, message.nbytes))
            total += message
    bufs[root] = total
    for w in range(n):
        if w != root:
            message = bufs[root].copy()
            log.append(Transfer(2, "broadcast", root, w, None, message.nbytes))
            bufs[w] = message
    return bufs, log


def ring_allreduce(
    buffers: Sequence[np.ndarray], snapshots: list[list[np.ndarray]] | None = None
) -> tuple[list[np.ndarray], list[Transfer]]:
    """Sum-all-reduce around a ring ``0 -> 1 -> ... -> N-1 -> 0``, step by step.

    Every buffer is cut into N chunks. Reduce-scatter, N - 1 steps: at step s each worker i
    sends chunk ``(i - s) mod N`` to its right neighbour, which adds it into its own copy; after
    the last step worker i holds the complete sum of chunk ``(i + 1) mod N``. All-gather, N - 1
    more steps: each worker passes the finished chunk it got last to its right neighbour, which
    overwrites its copy. Every worker sends 2 (N - 1) chunks of about M / N bytes each.

    All sends of one step happen "at once": messages are copied out of the senders' buffers
    before any receiver updates its own. If ``snapshots`` is a list, a copy of every worker's
    buffer is appended after each step (and once before the first), for printing.
    Returns each worker's resulting buffer and the log of transfers.
    """
    bufs = _check_buffers(buffers)
    n = len(bufs)
    bounds = chunk_bounds(bufs[0].size, n)
    log: list[Transfer] = []
    if snapshots is not None:
        snapshots.append([b.copy() for b in bufs])

    def run_step(step: int, phase: str, chunk_of_sender: list[int]) -> None:
        # 1) every worker copies the chunk it sends: the message on the wire
        messages = []
        for sender, chunk in enumerate(chunk_of_sender):
            lo, hi = bounds[chunk]
            message = bufs[sender][lo:hi].copy()
            receiver = (sender + 1) % n
            log.append(Transfer(step, phase, sender, receiver, chunk, message.nbytes))
            messages.append((receiver, chunk, message))
        # 2) every receiver applies what arrived: add (reduce-scatter) or overwrite (all-gather)
        for receiver, chunk, message in messages:
            lo, hi = bounds[chunk]
            if phase == "reduce-scatter":
                bufs[receiver][lo:hi] += message
            else:
                bufs[receiver][lo:hi] = message
        if snapshots is not None:
            snapshots.append([b.copy() for b in bufs])

    step = 0
    for s in range(n - 1):
        step += 1
        run_step(step, "reduce-scatter", [(i - s) % n for i in range(n)])
    for s in range(n - 1):
        step += 1
        run_step(step, "all-gather", [(i + 1 - s) % n for i in range(n)])
    return bufs, log


def bytes_sent_per_worker(log: Sequence[Transfer], n_workers: int) -> np.ndarray:
    """Total bytes each worker sent, counted from a transfer log (index = worker)."""
    sent = np.zeros(n_workers, dtype=np.int64)
    for t in log:
        sent[t.sender] += t.nbytes
    return sent


def ring_bytes_formula(n_workers: int, nbytes: int) -> float:
    """Bytes each worker sends in a ring all-reduce of an ``nbytes`` message: 2 (N-1)/N * M.
    Exact when the message splits into N equal chunks; otherwise within two elements."""
    return 2 * (n_workers - 1) / n_workers * nbytes


def naive_bytes_formula(n_workers: int, nbytes: int) -> tuple[int, int]:
    """Bytes sent in the naive all-reduce: ``(root, each non-root) = ((N-1) * M, M)``."""
    return (n_workers - 1) * nbytes, nbytes


# ---------------------------------------------------------------------------------------------
# Pictures and tables of a ring schedule
# ---------------------------------------------------------------------------------------------


def ring_schedule(log: Sequence[Transfer], n_workers: int) -> list[list[int | None]]:
    """The ring schedule as a grid: ``grid[step - 1][worker]`` = the chunk that worker sent."""
    n_steps = max(t.step for t in log)
    grid: list[list[int | None]] = [[None] * n_workers for _ in range(n_steps)]
    for t in log:
        grid[t.step - 1][t.sender] = t.chunk
    return grid


def plot_ring_schedule(log: Sequence[Transfer], n_workers: int, ax: Axes | None = None) -> Axes:
    """Draw who sends which chunk at each step of a ring all-reduce.

    Rows are steps (reduce-scatter, then all-gather), columns are workers; a cell's colour is the
    chunk the worker sends to its right neighbour, and its text says which chunk goes where.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    grid = ring_schedule(log, n_workers)
    phases = {t.step: t.phase for t in log}
    n_steps = len(grid)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 * n_workers + 2.2, 0.62 * n_steps + 1.2))
    colours = ListedColormap(plt.get_cmap("tab10").colors[:n_workers])
    values = np.array([[-1 if c is None else c for c in row] for row in grid], dtype=float)
    ax.imshow(values, cmap=colours, vmin=-0.5, vmax=n_workers - 0.5, aspect="auto", alpha=0.55)
    for step, row in enumerate(grid):
        for worker, chunk in enumerate(row):
            if chunk is not None:
                label = f"chunk {chunk} \u2192 w{(worker + 1) % n_workers}"
                ax.text(worker, step, label, ha="center", va="center", fontsize=9)
    counters = {"reduce-scatter": 0, "all-gather": 0}
    labels = []
    for step in range(1, n_steps + 1):
        counters[phases[step]] += 1
        labels.append(f"{phases[step]} {counters[phases[step]]}")
    ax.set_yticks(range(n_steps), labels)
    ax.set_xticks(range(n_workers), [f"worker {w}" for w in range(n_workers)])
    ax.xaxis.set_ticks_position("top")
    n_rs = counters["reduce-scatter"]
    ax.axhline(n_rs - 0.5, color="black", linewidth=2)
    ax.set_title(
        f"Ring all-reduce (simulated), N = {n_workers}: the chunk each worker sends to its right",
        pad=12,
    )
    return ax
