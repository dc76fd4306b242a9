"""Where does PyTorch training time go on MNIST, and how fast can the data path be?

    core/     errors, atomic writes, params and their schema, the data set's schema
    stages/   one module per DVC stage: paths and params in, files out
    shards/   the shard library: format, writer, reader, loaders, per-rank ranges
    bench/    the training ladder: the write-up's Datasets, data paths, runners
    cli.py    `python -m pipeline <stage>`: one thin command per stage

The shard library imports no stage; `python -m pipeline --help` lists the commands.
"""

__version__ = "0.1.0"
