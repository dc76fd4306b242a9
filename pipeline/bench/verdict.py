"""What bounds a training loop, in words, and what to try next: the rules, written once.

A budget's largest part names the bound. Each part has one reading and the changes that
address it, each tied to the rungs of the ladder that measured that very change (before ->
after), so that given this machine's bench results (`metrics/bench/<dataset>.json`) the
verdict quotes what the change did here.
"""

from __future__ import annotations

from dataclasses import dataclass

LABELS = {"data_wait": "data wait", "copy": "copy", "compute": "compute", "overhead": "overhead", "other": "other"}


@dataclass(frozen=True)
class Rule:
    meaning: str
    try_next: str
    rungs: tuple[tuple[str, str], ...]   # (before, after) rungs of the ladder that measured the change


RULES = {
    "data_wait": Rule("the step waits for its batch: the Dataset and DataLoader are the bound",
                      "do the per-item work once (convert the split in the Dataset's __init__), hand out "
                      "whole batches by index instead of item by item, or add DataLoader workers",
                      (("naive", "preprocessed"), ("naive", "workers"), ("preprocessed", "batched"))),
    "copy": Rule("moving batches to the device is the bound",
                 "pin the host memory and copy with non_blocking=True, or keep the data set on the device "
                 "and gather each batch there",
                 (("persistent", "pinned"), ("batched", "device"))),
    "compute": Rule("the model's own arithmetic is the bound: the data path keeps up",
                    "bf16 autocast, channels_last and torch.compile; past that, a smaller model or faster device",
                    (("device", "compiled"),)),
    "overhead": Rule("Python and kernel launches are the bound: the device idles while the host issues work",
                     "capture the step as a CUDA graph, torch.compile it, or do more per op (a larger batch)",
                     (("device", "graphed"), ("graphed", "compiled"))),
    "other": Rule("time outside the step and the wait for data is the bound: the loop's own code",
                  "log every N steps instead of each, avoid .item() or other syncs per step, checkpoint less often",
                  ()),
}


def evidence(rule: Rule, ladder: dict | None) -> str:
    """What the rule's changes did on the ladder given (a bench metrics document), in words."""
    if not ladder:
        return ""
    variants = ladder.get("variants", {})
    said = []
    for before, after in rule.rungs:
        if before in variants and after in variants:
            a, b = variants[before]["train_s"], variants[after]["train_s"]
            said.append(f"`{before}` {a:.3g} -> `{after}` {b:.3g} s/epoch")
    if not said:
        return ""
    return f" On this machine's ladder ({ladder.get('dataset', 'bench')}): " + "; ".join(said) + "."


def verdict(budget, ladder: dict | None = None) -> str:
    """One paragraph: the bound, its share, what it means, what to try and, given a bench
    metrics document, what those changes measured."""
    bound = budget.bound()
    rule = RULES[bound]
    share = budget.shares()[bound]
    return (f"{LABELS[bound].upper()}-BOUND: {LABELS[bound]} is {share:.0%} of the step; {rule.meaning}. "
            f"Try: {rule.try_next}.{evidence(rule, ladder)}")
