"""What `TimeBudget` costs a loop outside its profiled window: the same steps bare and
wrapped (the window already over), interleaved, median of the repeats.

    python benchmarks/budget_overhead.py [--steps 300] [--repeat 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from pipeline.bench.budget import TimeBudget


def train_step(model, optimizer, x, y) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def loop(batches: list, model, optimizer, budget: TimeBudget | None) -> float:
    """Seconds for one pass over `batches`, bare or through `budget`."""
    start = time.perf_counter()
    if budget is None:
        for x, y in batches:
            train_step(model, optimizer, x, y)
    else:
        for x, y in budget.batches(batches):
            with budget.step():
                train_step(model, optimizer, x, y)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.randn(128, 64), torch.randint(0, 10, (128,))) for _ in range(args.steps)]
    budget = TimeBudget("cpu", steps=5, skip=1, flops=False)
    loop(batches[:8], model, optimizer, budget)  # the window, over before anything is timed
    assert budget.done
    bare, wrapped = [], []
    for _ in range(args.repeat):  # interleaved: a busy moment hits both
        bare.append(loop(batches, model, optimizer, None) / args.steps)
        wrapped.append(loop(batches, model, optimizer, budget) / args.steps)
    b, w = statistics.median(bare), statistics.median(wrapped)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, one thread; "
          f"{args.steps} steps x {args.repeat} repeats, interleaved; medians")
    print(f"bare loop      {1e3 * b:.3f} ms/step (spread {1e3 * (max(bare) - min(bare)):.3f} ms)")
    print(f"with TimeBudget {1e3 * w:.3f} ms/step (spread {1e3 * (max(wrapped) - min(wrapped)):.3f} ms)")
    print(f"cost outside the window: {100 * (w - b) / b:+.2f}% of a step")


if __name__ == "__main__":
    main()
