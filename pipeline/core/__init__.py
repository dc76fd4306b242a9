"""What every part of the project shares: errors, bounded reads and atomic writes, params
and their schema (with the names params refer to: codecs, ladder rungs), the data set's
schema, sources.yaml, and the Parquet layouts every reader of the convert stage's files
checks (`parquet`, the one module here that needs pyarrow: the shard library never imports
it)."""
