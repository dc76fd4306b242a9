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
    rungs: tuple[tuple[str, str], ...]   # (before, after) rungs that measured the change, closest first


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


# On the CPU the host does the work itself: no device idles, no copy to a device.
CPU_RULES = {
    "copy": Rule("the marked copies are the bound",
                 "avoid the copy (a view, or the data already in the layout the step takes), or copy once "
                 "before the loop", ()),
    "overhead": Rule("Python and op dispatch inside the step are the bound: its ops are small",
                     "fewer and larger ops (a larger batch, vectorised code), or torch.compile",
                     (("device", "compiled"),)),
}


# On CUDA the overhead's two halves (`budget.idle_split`) call for different changes.
IDLE_RULES = {
    "host_wait": Rule("the device idles with nothing queued: the host issues kernels slower than the device "
                      "runs them (Python, dispatch, launch calls)",
                      "capture the step as a CUDA graph or torch.compile it, or do more per launch (a larger batch)",
                      (("device", "graphed"), ("graphed", "compiled"))),
    "launch_gap": Rule("the device idles between kernels already queued: many kernels, each too small to cover "
                       "its own start",
                       "fewer, larger kernels: torch.compile to fuse them, a fused optimizer, a larger batch",
                       (("graphed", "compiled"),)),
}


def rule_for(part: str, device: str) -> Rule:
    """The rule for `part` on a device of that type ("cpu", "cuda", "cuda:0", ...)."""
    return (CPU_RULES.get(part) if device.startswith("cpu") else None) or RULES[part]


def _figure(name: str, variant: dict) -> str:
    marks = [word for key, word in (("extrapolated", "sampled"), ("unstable", "unstable")) if variant.get(key)]
    return f"`{name}` {variant['train_s']:.3g}" + (f" ({', '.join(marks)})" if marks else "")


def evidence(rule: Rule, ladder: dict | None) -> str:
    """What the rule's closest change did on the ladder given (a bench metrics document), in
    words: the first of its rung pairs that the ladder ran."""
    variants = (ladder or {}).get("variants") or {}
    pair = next(((before, after) for before, after in rule.rungs if before in variants and after in variants), None)
    if pair is None:
        return ""
    before, after = pair
    device = (ladder.get("machine") or {}).get("device")
    where = f"{ladder.get('dataset', 'bench')}" + (f", on {device}" if device else "")
    quick = " (a quick run)" if (ladder.get("params") or {}).get("quick") else ""
    return (f" On this machine's ladder ({where}){quick}: "
            f"{_figure(before, variants[before])} -> {_figure(after, variants[after])} s/epoch.")


def verdict(budget, ladder: dict | None = None) -> str:
    """One paragraph: the bound, its share, what it means, what to try and, given a bench
    metrics document, what those changes measured."""
    bound = budget.bound()
    rule = rule_for(bound, budget.device)
    share = budget.shares()[bound]
    halves = budget.idle_shares() if bound == "overhead" else None
    detail = ""
    if halves:
        rule = IDLE_RULES[max(halves, key=halves.__getitem__)]
        detail = f" (host wait {halves['host_wait']:.0%}, launch gaps {halves['launch_gap']:.0%})"
    return (f"{LABELS[bound].upper()}-BOUND: {LABELS[bound]} is {share:.0%} of the step{detail}; {rule.meaning}. "
            f"Try: {rule.try_next}.{evidence(rule, ladder)}")
