"""The write-up's SimpleCNN (206,922 parameters), unchanged, so every variant trains the same model."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.shards.transforms import Int64, UnitFloat

# What the model takes of MNIST's stored sample (uint8 [28, 28] images, uint8 labels): float
# images [1, 28, 28] in 0..1 and int64 class indices; every reader of the ladder and of the
# train stage names this transform (the shard library converts nothing unasked).
MODEL_INPUT = (UnitFloat("images", add_channel=True), Int64("labels"))


class SimpleCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
