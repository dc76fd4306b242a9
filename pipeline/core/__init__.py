"""What the stages share, and nothing else: errors, bounded reads and atomic writes, params
and their schema (with the names params refer to: codecs, ladder rungs), the data set's
columns, sources.yaml, and the Parquet layouts every reader of the convert stage's files
checks (`parquet`, the one module here that needs pyarrow). Core imports nothing else of the
project; what one stage alone uses lives beside that stage."""
