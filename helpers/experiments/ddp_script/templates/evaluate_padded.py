"""Evaluate a checkpoint on the test set, each worker taking a share of it:

    torchrun --standalone --nproc-per-node 3 evaluate_padded.py --data har.npz --checkpoint ckpt.pt

The shares come from a DistributedSampler, as the training's do, and that is the mistake: to give
every rank the same number of rows it repeats the first few when the test set does not split
evenly, so those rows are counted twice.
"""

import argparse

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data.distributed import DistributedSampler


def mlp():
    """561 features, two hidden layers of 1,024 ReLU units, 6 activities."""
    return nn.Sequential(
        nn.Linear(561, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 6)
    )


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description="Test accuracy of a checkpoint.")
    parser.add_argument("--data", required=True, help=".npz with X_test, y_test")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint ddp_har.py saved")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    arrays = np.load(args.data)
    X, y = torch.from_numpy(arrays["X_test"]), torch.from_numpy(arrays["y_test"])
    model = mlp()
    model.load_state_dict(torch.load(args.checkpoint)["model"])
    model.eval()

    rows = torch.tensor(list(DistributedSampler(range(len(y)), world, rank, shuffle=False)))
    correct = (model(X[rows]).argmax(dim=1) == y[rows]).sum()
    counts = torch.stack([correct, torch.tensor(len(rows))])
    dist.all_reduce(counts)  # summed over the ranks
    if rank == 0:
        correct, counted = counts.tolist()
        print(f"test accuracy: {correct}/{counted} = {correct / counted:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
