"""A training script as users write it, with no profiling in it: the same MLP on 64 float
features and per-item Dataset as examples/own_loop.py, for several epochs with a test pass.
`python -m pipeline profile` finds its loop and gives its time budget without an edit.

    python examples/plain_train.py --epochs 2                      # just trains
    python -m pipeline profile examples/plain_train.py --epochs 2  # the budget of its loop
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    """Each item built from a list of Python floats: the per-item work of a first loop."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rows = rng.normal(size=(n, 64)).tolist()
        self.labels = (rng.random(n) * 10).astype(int).tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return torch.tensor(self.rows[i], dtype=torch.float32), self.labels[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = DataLoader(Rows(40_000), batch_size=256, shuffle=True)
    test = DataLoader(Rows(5_000, seed=1), batch_size=1024)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy {correct / 5_000:.3f}")


if __name__ == "__main__":
    main()
