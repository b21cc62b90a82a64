"""Step 1: every worker joins the process group torchrun set up, and only rank 0 logs and saves:

    torchrun --standalone --nproc-per-node 2 step1_process_group.py --data har.npz --out run/
"""

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler


class HAR(Dataset):
    """One split of the .npz file. An item is (features, label, row): the row says which sample
    it was, so that a run can report what it trained on."""

    def __init__(self, path, split):
        arrays = np.load(path)
        self.X = torch.from_numpy(arrays[f"X_{split}"])
        self.y = torch.from_numpy(arrays[f"y_{split}"])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, row):
        return self.X[row], self.y[row], row


def mlp():
    """561 features, two hidden layers of 1,024 ReLU units, 6 activities."""
    return nn.Sequential(
        nn.Linear(561, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 6)
    )


def main():
    parser = argparse.ArgumentParser(description="Train the MLP on HAR.")
    parser.add_argument("--data", required=True, help=".npz with X_train, y_train, X_test, y_test")
    parser.add_argument("--out", required=True, help="folder for the checkpoint")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank = dist.get_rank()  # 0 to WORLD_SIZE - 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    train = HAR(args.data, "train")
    order = torch.Generator()
    sampler = RandomSampler(train, generator=order)
    loader = DataLoader(train, batch_size=args.global_batch, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    seen = []  # the rows of every batch, in order
    for epoch in range(args.epochs):
        order.manual_seed(epoch)  # this epoch's shuffle: randperm seeded by the epoch
        for x, y, rows in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            seen.append(rows)
        if rank == 0:  # one log, not one per worker
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.4f}", flush=True)

    torch.save(torch.stack(seen), out / f"seen_rank{rank}.pt")  # one file per rank
    if rank == 0:  # one writer
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(checkpoint, out / "checkpoint.pt")
        print(f"saved {out / 'checkpoint.pt'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
