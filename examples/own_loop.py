"""The time budget on a loop that is not the ladder's: a small MLP on 64 float features, fed
by a per-item Dataset that builds each sample from a Python row, as many first loops do.

    python examples/own_loop.py                                   # the budget and its verdict
    python examples/own_loop.py --ladder metrics/bench/mnist.json # ... quoting this machine's ladder
    python examples/own_loop.py --batched                         # the same loop, batches by index
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from plain_train import Rows  # examples/plain_train.py: the same data and per-item Dataset
from torch.utils.data import DataLoader

from pipeline.budget import TimeBudget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ladder", type=Path, help="a bench metrics file whose rungs the verdict quotes")
    parser.add_argument("--batched", action="store_true", help="gather whole batches by index instead")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = Rows(40_000)
    if args.batched:  # converted once; each batch gathered by a shuffled index
        x_all, y_all = torch.tensor(data.rows), torch.tensor(data.labels)
        loader = ((x_all[i], y_all[i]) for i in torch.randperm(len(data)).split(256))
    else:
        loader = DataLoader(data, batch_size=256, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    budget = TimeBudget("cpu", steps=20, skip=5)  # 1: a window of 20 steps after 5
    for x, y in budget.batches(loader):  # 2: the wait for each batch is timed
        with budget.step():  # 3: the step itself
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if budget.done:
            break
    ladder = json.loads(args.ladder.read_text()) if args.ladder else None
    print(budget.result.report(ladder))


if __name__ == "__main__":
    main()
