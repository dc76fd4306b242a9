"""Training loops, each built to be bound by one thing, for `python -m pipeline profile`:

    python -m pipeline profile benchmarks/verdict_loops.py data      # a per-item Dataset
    python -m pipeline profile benchmarks/verdict_loops.py compute   # wide matmuls, resident batches
    python -m pipeline profile benchmarks/verdict_loops.py tiny      # Linear(4, 2), batch 8
    python -m pipeline profile benchmarks/verdict_loops.py threads   # 8x the cores in intra-op threads
    python -m pipeline profile benchmarks/verdict_loops.py launch    # 24 tiny layers: many small ops

A second argument names the device (`cuda`): the model trains there and each batch is copied
there; on CUDA `compute` is sized for a GPU, its split kept on the device and gathered per
batch. benchmarks/verdicts.py runs them quiet and beside busy processes and prints each
verdict; the `gpu` tests run data, launch and compute on CUDA.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset


class PerItem(Dataset):
    """Each sample built from Python lists, one at a time, as many first Datasets do."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randn(n, 64, generator=generator).tolist()
        self.labels = torch.randint(0, 10, (n,), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return torch.tensor([v * 0.5 for v in self.rows[i]]), self.labels[i]


def loop(kind: str, device: torch.device = torch.device("cpu")) -> tuple[DataLoader, torch.nn.Module]:
    """The loader and model of `kind` (on `device`'s type where that changes what binds it)."""
    torch.manual_seed(0)
    if kind == "compute" and device.type == "cuda":  # a GPU outruns any host loader: data resident
        data = TensorDataset(torch.randn(16384, 4096, device=device), torch.randint(0, 10, (16384,), device=device))
        batches = BatchSampler(RandomSampler(data), batch_size=2048, drop_last=True)
        layers = [torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
        return DataLoader(data, sampler=batches, batch_size=None), torch.nn.Sequential(
            *layers, torch.nn.Linear(4096, 10)
        )
    if kind == "launch":
        data = TensorDataset(torch.randn(8192, 4), torch.randint(0, 2, (8192,)))
        layers = [module for _ in range(24) for module in (torch.nn.Linear(4, 4), torch.nn.Tanh())]
        return DataLoader(data, batch_size=64, shuffle=True), torch.nn.Sequential(*layers, torch.nn.Linear(4, 2))
    if kind == "data":
        return DataLoader(PerItem(20_000), batch_size=256, shuffle=True), torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
    if kind == "compute":
        data = TensorDataset(torch.randn(16384, 1024), torch.randint(0, 10, (16384,)))
        return DataLoader(data, batch_size=512, shuffle=True), torch.nn.Sequential(
            torch.nn.Linear(1024, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )
    if kind == "tiny":
        data = TensorDataset(torch.randn(4096, 4), torch.randint(0, 2, (4096,)))
        return DataLoader(data, batch_size=8, shuffle=True), torch.nn.Linear(4, 2)
    if kind == "threads":
        torch.set_num_threads(8 * (os.cpu_count() or 1))  # far more threads than cores
        data = TensorDataset(torch.randn(8192, 256), torch.randint(0, 10, (8192,)))
        return DataLoader(data, batch_size=64, shuffle=True), torch.nn.Sequential(
            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
    raise SystemExit(f"{kind}: one of data, compute, tiny, threads, launch")


def main() -> None:
    device = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
    loader, model = loop(sys.argv[1] if len(sys.argv) > 1 else "data", device)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
