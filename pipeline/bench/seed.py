"""The write-up's two Datasets, kept exactly as the story wrote them: the ladder's first rungs.

Version 1 does all the work per item, every epoch (a pandas row, a float conversion, two
tensors); version 2 does it once in `__init__`. Their cost is the story, so they are not
made any faster here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch


class NaiveDataset(torch.utils.data.Dataset):
    """The write-up's Dataset v1: a pandas frame, and all the work per item, every epoch."""

    def __init__(self, parquet_path: Path) -> None:
        self.df = pd.read_parquet(parquet_path)
        self.feature_cols = [c for c in self.df.columns if c != "label"]

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        row = self.df.iloc[idx]
        features = row[self.feature_cols].values.astype(np.float32)
        image = torch.tensor(features).reshape(1, 28, 28) / 255.0
        label = torch.tensor(row["label"], dtype=torch.long)
        return {"image": image, "label": label}


class PreprocessedDataset(torch.utils.data.Dataset):
    """The write-up's Dataset v2: everything converted once in `__init__`; items only index."""

    def __init__(self, parquet_path: Path) -> None:
        df = pd.read_parquet(parquet_path)
        features = df.drop(columns="label").to_numpy(dtype=np.float32)
        self.images = torch.from_numpy(np.require(features, requirements="W")).reshape(-1, 1, 28, 28) / 255.0
        self.labels = torch.from_numpy(df["label"].to_numpy().astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[idx], "label": self.labels[idx]}
