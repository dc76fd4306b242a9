"""Where does PyTorch training time go on MNIST, and how fast can the data path be?

One module per pipeline concern (fetch, idx, csvdata, convert, codecs, shards, bench,
report); `python -m pipeline --help` lists one command per DVC stage.
"""

__version__ = "0.1.0"
