"""Stage `machine`: what the bench's figures depend on, written so DVC can see it.

The bench measures the machine it runs on, so the machine is one of its inputs: this stage
runs on every `dvc repro` (`always_changed`) and writes a small fingerprint (CPU model and
cores, memory, GPU model and count, torch and CUDA versions, the device the bench uses). On
the same machine the bytes come out identical and DVC runs nothing downstream; on another
machine they differ, and `bench@*` and `train@*` run there. Nothing that varies between two
runs on one machine (time, load, free memory) goes in.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.budget import Fingerprint, fingerprint
from pipeline.core.atomic import write_json


def write_machine(out: Path, device: str = "auto") -> Fingerprint:
    machine = fingerprint(device)
    write_json(Path(out), machine)
    return machine
