"""What `TimeBudget` costs a loop outside its profiled window: the same steps bare and
wrapped (the window already over), interleaved, median of the repeats.

    python benchmarks/budget_overhead.py [--steps 300] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pipeline.budget import TimeBudget


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
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.randn(128, 64), torch.randint(0, 10, (128,))) for _ in range(args.steps)]
    budget = TimeBudget("cpu", steps=5, skip=1, flops=False)
    loop(batches[:8], model, optimizer, budget)  # the window, over before anything is timed
    assert budget.done
    loop(batches, model, optimizer, None)  # both warm before any clock
    loop(batches, model, optimizer, budget)
    times: dict[str, list[float]] = {"bare loop": [], "with TimeBudget": []}
    for repeat in range(args.repeat):  # interleaved, the order alternating: a busy moment hits both
        order = [None, budget] if repeat % 2 == 0 else [budget, None]
        for wrapper in order:
            name = "bare loop" if wrapper is None else "with TimeBudget"
            times[name].append(loop(batches, model, optimizer, wrapper) / args.steps)
    print(
        f"# torch {torch.__version__}, one thread; a {args.steps}-step pass x {args.repeat} repeats each, "
        "interleaved; ms per step"
    )
    for name, values in times.items():
        print(
            f"{name:16s} median {1e3 * statistics.median(values):.3f}  min {1e3 * min(values):.3f}  "
            f"max {1e3 * max(values):.3f}"
        )
    b, w = (statistics.median(v) for v in times.values())
    low_b, low_w = (min(v) for v in times.values())
    print(
        f"cost outside the window: {100 * (w - b) / b:+.2f}% of a step (medians), "
        f"{100 * (low_w - low_b) / low_b:+.2f}% (minimums)"
    )
    empty = [None] * 200_000
    bare_s = min(_empty_pass(empty, None) for _ in range(5))
    wrapped_s = min(_empty_pass(empty, budget) for _ in range(5))
    print(
        f"the wrapper alone, empty steps: {1e6 * (wrapped_s - bare_s) / len(empty):.2f} us per step "
        f"({100 * (wrapped_s - bare_s) / len(empty) / low_b:.2f}% of this loop's fastest step)"
    )


def _empty_pass(items: list, budget: TimeBudget | None) -> float:
    """Seconds for a loop that does nothing per item, bare or through `budget`: the wrapper's
    own cost, free of the noise of a real step."""
    start = time.perf_counter()
    if budget is None:
        for _ in items:
            pass
    else:
        for _ in budget.batches(items):
            with budget.step():
                pass
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
