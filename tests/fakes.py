"""A ``RunResult`` for tests that need one without training: placeholder values for every field
a test does not set."""

from __future__ import annotations

from helpers.training.runs import RunResult

PLACEHOLDERS = dict(
    world=2,
    global_batch=256,
    epochs=1,
    threads_per_worker=1,
    seconds=1.0,
    startup_seconds=1.0,
    accuracy=0.5,
    replicas_identical=True,
    checksums=[],
    accuracies=[],
    steps=20,
    data_source="test",
)


def run_result(**fields) -> RunResult:
    """A ``RunResult`` with ``fields`` and placeholders for the rest."""
    return RunResult(**{**PLACEHOLDERS, **fields})
