"""Train the course's MLP on HAR with DistributedDataParallel, one worker per process:

    torchrun --standalone --nproc-per-node 2 ddp_har.py --data har.npz --out run/

Step 3 of 3: DDP averages the gradients, so that N workers do the training one process does.
"""

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


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
    rank, world = dist.get_rank(), dist.get_world_size()  # 0 to world - 1, and world
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split into {world} shares")

    train = HAR(args.data, "train")
    # the same seed on every rank: one shuffle, and rank r takes rows r, r + world, r + 2 world...
    sampler = DistributedSampler(
        train, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True
    )
    loader = DataLoader(
        train, batch_size=args.global_batch // world, sampler=sampler, drop_last=True
    )

    torch.manual_seed(0)
    model = DDP(mlp())  # broadcasts rank 0's weights; averages the gradients in backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    seen = []  # the rows of every batch, in order
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # this epoch's shuffle: randperm seeded by seed + epoch
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
        # the MLP's own state_dict: keys without DDP's "module." prefix
        checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(checkpoint, out / "checkpoint.pt")
        print(f"saved {out / 'checkpoint.pt'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
