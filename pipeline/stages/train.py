"""Training under torchrun: DistributedDataParallel over shards streamed per rank.

    torchrun --standalone --nproc-per-node 2 -m pipeline train mnist --shards data/shards/mnist \
        --out metrics/train/mnist.json

gloo on the CPU, nccl on CUDA (one GPU per rank, by LOCAL_RANK). The global batch
(`train.batch_size`, the seed's 512) is split evenly across ranks; DDP averages the ranks'
gradients, so each step's update is the seed's mean over 512 samples and the learning rate
stays the seed's (1e-3): no scaling rule is needed because the global batch does not change.
Each rank reads only its shards (`ranks.RankShards`); the test split is sliced across ranks
and the correct counts summed. Rank 0 writes the metrics.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.core.atomic import write_text
from pipeline.core.errors import InputError
from pipeline.bench.model import SimpleCNN
from pipeline.shards.ranks import RankShards
from pipeline.shards.loaders import DeviceBatches, to_float
from pipeline.shards.reader import load_split


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def train_ddp(shards: Path, out: Path, *, epochs: int, batch_size: int, lr: float, seed: int,
              record: bool = False) -> dict | None:
    """Train SimpleCNN on `shards` with every rank of the torchrun job; rank 0 returns the metrics."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise InputError("train runs under torchrun: torchrun --standalone --nproc-per-node N "
                         "-m pipeline train DATASET --shards ... --out ...")
    device = _device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return _train(Path(shards), Path(out), device, epochs, batch_size, lr, seed, record)
    finally:
        dist.destroy_process_group()


def _train(shards: Path, out: Path, device: torch.device, epochs: int, batch_size: int, lr: float, seed: int,
           record: bool) -> dict | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    if batch_size % world:
        raise ValueError(f"train.batch_size {batch_size} does not split evenly across {world} ranks")
    local_batch = batch_size // world
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = SimpleCNN().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    train = RankShards(shards / "train", rank, world, seed)
    test_x, test_y = load_split(shards / "test", device)
    test = DeviceBatches(test_x, test_y, local_batch, shuffle=False, rank=rank, world_size=world)
    history, seen = [], {}
    for epoch in range(epochs):
        start = time.perf_counter()
        part = train.epoch(epoch)
        images, labels, order = part.images.to(device), part.labels.to(device), part.order.to(device)
        # Equal sample counts on every rank, so the same steps, the last one partial as in the
        # seed (equal partial batches on every rank: DDP's average is still the global mean).
        steps = -(-len(order) // local_batch)
        total = torch.zeros((), device=device)
        for step in range(steps):
            index = order[step * local_batch : (step + 1) * local_batch]
            loss = F.cross_entropy(ddp(to_float(images[index])), labels[index].long())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages gradients across ranks: the global batch's mean
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        correct = torch.zeros((), device=device, dtype=torch.long)
        with torch.inference_mode():
            for x, y in test:
                correct += (model(x).argmax(1) == y).sum()
        dist.all_reduce(correct)
        history.append({"epoch": epoch + 1, "loss": round(total.item() / world / max(steps, 1), 5),
                        "accuracy": round(correct.item() / (len(test) and test.per_rank * world), 4),
                        "steps": steps, "samples_per_rank": len(order), "dropped": part.dropped,
                        "seconds": round(time.perf_counter() - start, 3)})
        if record and epoch == 0:
            seen = {"ids": part.seen().tolist()}
        if rank == 0:
            print(f"train epoch {epoch + 1}/{epochs}: {history[-1]}", file=sys.stderr, flush=True)
    if record:
        params = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
        write_text(out.with_name(f"{out.stem}.rank{rank}.json"), json.dumps(
            {"rank": rank, "steps": [h["steps"] for h in history], "params_sum": float(params.double().sum()),
             "params_head": params[:8].tolist(), **seen}) + "\n")
    if rank != 0:
        return None
    document = {"world_size": world, "backend": dist.get_backend(), "device": str(device),
                "global_batch": batch_size, "local_batch": local_batch, "lr": lr, "seed": seed, "epochs": history}
    write_text(out, json.dumps(document, indent=2) + "\n")
    return document

