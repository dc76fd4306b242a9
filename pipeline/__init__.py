"""Where does PyTorch training time go on MNIST, and how fast can the data path be?

    core/     what every stage shares: errors, bounded reads, atomic writes, params and
              their schema, the data set's columns, sources.yaml, the Parquet layouts
    shards/   the shard library: format, writer, reader, loaders, per-rank ranges
    bench/    the training ladder and the time budget: the write-up's Datasets, data
              paths, runners, TimeBudget, the verdict, a script's loop found unedited
    stages/   one module (the report: a package) per DVC stage, paths and params in, files
              out; with what stages alone share (MNIST's sample, the metrics schema)
    cli.py    `python -m pipeline <command>`: one thin command per stage, and `profile`

Imports flow one way, core <- shards <- bench <- stages <- cli; the shard library imports
no stage; `python -m pipeline --help` lists the commands.
"""

__version__ = "0.1.0"
