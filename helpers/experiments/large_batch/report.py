"""The tables notebook 06 prints, as text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd


def _steps(median: float) -> str:
    """A median step count as it is: whole, or ending in .5 (rounding it would make the printed
    steps times the batch disagree with the samples printed beside them)."""
    return f"{median:.0f}" if median == int(median) else f"{median:.1f}"


def format_runs(runs: pd.DataFrame, rates: Mapping[int, Sequence[float]] | None = None) -> str:
    """Batch by rate: the seeds that reached the target of the seeds run, and their steps
    (median, exact: a median of 2 can end in .5); then, apart, the runs that did not: "div"
    (diverged: a loss not finite, or ending above its first), "cut" (stopped by
    ``runs_to_target``'s slack rule, once it could no longer be the best) and "capped" (ran its
    whole budget). With ``rates``, each batch's grid: a rate of it not run (``runs_to_target``'s
    rules skipped it) shows "-", a rate outside it stays blank."""

    def cell(at: pd.DataFrame) -> str:
        reached = at[at["reached"]]
        missed = at[~at["reached"]]
        div = missed["diverged"]
        cut = ~div & (missed["cut"] if "cut" in missed else False)
        parts = [f"{len(reached)}/{len(at)}"]
        parts += [f"{_steps(reached['steps'].median())} steps"] if len(reached) else []
        for count, name in ((cut.sum(), "cut"), (div.sum(), "div"),
                            ((~cut & ~div).sum(), "capped")):  # fmt: skip
            parts += [f"{count} {name}"] if count else []
        return ", ".join(parts)

    table = runs.groupby(["global_batch", "lr"]).apply(cell, include_groups=False).unstack("lr")
    if rates is not None:
        table = table.reindex(columns=sorted({lr for grid in rates.values() for lr in grid}))
        table = table.astype(object)
        for batch in table.index:
            for lr in rates.get(batch, ()):
                if pd.isna(table.loc[batch, lr]):
                    table.loc[batch, lr] = "-"
    table = table.fillna("")
    table.columns = [f"lr {lr:g}" for lr in table.columns]
    table.index.name = "batch"
    return table.to_string()


def format_best(best: pd.DataFrame) -> str:
    """Per batch, the best rate and the median steps and samples to the target."""
    shown = best.assign(
        best_lr=[f"{v:g}" for v in best["best_lr"]],
        steps=[_steps(v) for v in best["steps"]],
        samples=[f"{v:,.0f}" for v in best["samples"]],
    )
    return shown.rename(columns={"global_batch": "batch", "best_lr": "best lr"}).to_string(
        index=False
    )


def format_noise(pooled: pd.DataFrame, along: pd.DataFrame) -> str:
    """Per step: the loss, the pooled ``B_simple`` and the range of the seeds' own estimates."""
    spread = along.groupby("step")["b_simple"].agg(["min", "max"])
    rows = pooled.set_index("step").join(spread).reset_index()
    return pd.DataFrame(
        {
            "step": rows["step"],
            "loss": [f"{v:.3f}" for v in rows["loss"]],
            "|G|^2": [f"{v:.3f}" for v in rows["grad_sq"]],
            "tr(Sigma)": [f"{v:.1f}" for v in rows["trace"]],
            "B_simple": [f"{v:.0f}" for v in rows["b_simple"]],
            "seeds: from": [f"{v:.0f}" for v in rows["min"]],
            "to": [f"{v:.0f}" for v in rows["max"]],
        }
    ).to_string(index=False)
