"""The tables notebook 06 prints, as text: the plan, the loss grid, the best rates, the noise
scale, warm-up and the time to a target."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from helpers.training import steps_per_epoch


def _fmt(frame: pd.DataFrame, formats: dict[str, str], names: dict[str, str]) -> str:
    shown = frame[list(formats)].copy()
    for column, spec in formats.items():
        shown[column] = [format(v, spec) if pd.notna(v) else "-" for v in shown[column]]
    return shown.rename(columns=names).to_string(index=False)

def format_plan(batches: Sequence[int], n_samples: int, epochs: int) -> str:
    """The budget per batch: steps and samples seen, and what the dropped last batch leaves out."""
    rows = [
        {
            "global batch": b,
            "share of the data": f"{b / n_samples:.1%}",
            "steps/epoch": steps_per_epoch(n_samples, b),
            f"steps in {epochs} epochs": epochs * steps_per_epoch(n_samples, b),
            "samples seen": epochs * steps_per_epoch(n_samples, b) * b,
            "left out/epoch": n_samples - steps_per_epoch(n_samples, b) * b,
        }
        for b in batches
    ]
    return pd.DataFrame(rows).to_string(index=False)

def format_loss_grid(grid: pd.DataFrame) -> str:
    """Final training loss, mean ± standard deviation over the seeds, batch by lr ("div":
    at least one seed diverged)."""

    def cell(runs: pd.DataFrame) -> str:
        if runs["diverged"].any():
            return f"div ({int(runs['diverged'].sum())}/{len(runs)})"
        return f"{runs['final_loss'].mean():.3f}±{runs['final_loss'].std(ddof=1):.3f}"

    table = grid.groupby(["global_batch", "lr"]).apply(cell, include_groups=False).unstack("lr")
    table.columns = [f"lr {lr:.3f}" for lr in table.columns]
    table.index.name = "batch"
    return table.to_string()

def format_best_lr(best: pd.DataFrame) -> str:
    """The tuning's verdict per batch."""
    return _fmt(
        best,
        {
            "global_batch": "d",
            "steps": "d",
            "samples": ",d",
            "best_lr": ".3f",
            "lowest_seed_best": ".3f",
            "highest_seed_best": ".3f",
            "final_loss": ".3f",
            "final_loss_std": ".3f",
            "accuracy": ".1%",
        },
        {
            "global_batch": "batch",
            "best_lr": "best lr",
            "lowest_seed_best": "seeds' best: from",
            "highest_seed_best": "to",
            "final_loss": "train loss",
            "final_loss_std": "± (sd)",
            "accuracy": "test acc.",
        },
    )

def format_noise_scale(table: pd.DataFrame) -> str:
    """The noise-scale estimates during training (over the seeds, and each seed's range)."""
    return _fmt(
        table,
        {
            "epochs": "d",
            "small_batch": "d",
            "big_batch": "d",
            "seeds": "d",
            "grad_sq": ".3f",
            "trace": ".1f",
            "b_simple": ".0f",
            "b_simple_low": ".0f",
            "b_simple_high": ".0f",
        },
        {
            "epochs": "after epochs",
            "small_batch": "local batch",
            "big_batch": "averaged batch",
            "grad_sq": "|G|^2",
            "trace": "tr(Sigma)",
            "b_simple": "B_simple",
            "b_simple_low": "seeds' B_simple: from",
            "b_simple_high": "to",
        },
    )

def format_warmup(grid: pd.DataFrame) -> str:
    """With against without warm-up: final loss (mean ± sd over seeds), peak loss, divergences."""
    rows = []
    for (lr, warmup), runs in grid.groupby(["lr", "warmup_steps"]):
        rows.append(
            {
                "lr": f"{lr:.3f}",
                "warm-up steps": warmup,
                "diverged": f"{int(runs['diverged'].sum())}/{len(runs)}",
                "peak loss (median)": f"{runs['peak_loss'].median():.2f}",
                "final train loss": f"{runs['final_loss'].mean():.3f}"
                f"±{runs['final_loss'].std(ddof=1):.3f}",
                "test acc.": f"{runs['accuracy'].mean():.1%}",
            }
        )
    return pd.DataFrame(rows).to_string(index=False)

def format_time_to_target(table: pd.DataFrame) -> str:
    """Budgets to the target, per batch at its best rate."""
    shown = table.assign(
        reached=[f"{r}/{n}" for r, n in zip(table.seeds_reaching, table.seeds, strict=True)]
    )
    return _fmt(
        shown,
        {
            "global_batch": "d",
            "best_lr": ".3f",
            "reached": "s",
            "epochs": ".1f",
            "samples": ",.0f",
            "steps": ".0f",
            "seconds": ".2f",
        },
        {
            "global_batch": "batch",
            "best_lr": "best lr",
            "reached": "seeds reaching",
            "epochs": "epochs (median)",
            "seconds": "seconds (1 process)",
        },
    )
