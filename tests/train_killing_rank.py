"""`pipeline train` under torchrun with one rank that SIGKILLs itself after an optimizer step
(no cleanup, as a lost node): the run tests/test_scale.py resumes.

    torchrun --standalone --nproc-per-node 2 tests/train_killing_rank.py --kill-rank 1 --after-step 14 \
        t --shards SHARDS --out OUT --params PARAMS --checkpoint CKPT [--record]

The training entry is the product's (`train_ddp` with the run `TrainRun.from_params` builds
from the params file, as the command does); only the `after_step` hook is the test's.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from pipeline.core.params import read_section
from pipeline.stages.train.settings import TrainSettings
from pipeline.stages.train.stage import TrainRun, train_ddp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, required=True)
    parser.add_argument("--after-step", type=int, required=True)
    parser.add_argument("dataset")
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    def kill(rank: int, global_step: int) -> None:
        if rank == args.kill_rank and global_step == args.after_step:
            os.kill(os.getpid(), signal.SIGKILL)

    run = TrainRun.from_params(
        args.dataset, read_section(args.params, TrainSettings, "train"), record=args.record, checkpoint=args.checkpoint
    )
    train_ddp(args.shards, args.out, run, after_step=kill)


if __name__ == "__main__":
    main()
