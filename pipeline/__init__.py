"""Where does PyTorch training time go on MNIST, and how fast can the data path be?

    core/     what the stages share: errors, bounded reads, atomic writes, params and the
              bounds every settings dataclass is written with, the data set's columns,
              sources.yaml, Parquet
    shards/   the shard library: format, writer, reader, loaders, per-rank ranges
    budget/   the time budget of any PyTorch loop: TimeBudget, the verdict, `profile`
    bench/    the training ladder: its stage, settings and document, the write-up's Datasets
              and model, data paths, runners
    stages/   one folder (or module) per DVC stage: fetch/, convert/, shard/, train/,
              report/, with csvdata, codecs, summary, machine and the params check;
              mnist.py (MNIST's files and sample) and the Ray cluster both engines use
    cli.py    `python -m pipeline <command>`: one thin command per stage, and `profile`

Imports flow one way, core <- shards, budget <- bench <- stages <- cli (tests/test_layout.py
checks it file by file); `python -m pipeline --help` lists the commands.
"""

__version__ = "0.1.0"
