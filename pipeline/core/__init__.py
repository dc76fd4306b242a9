"""What the stages share, and nothing else: errors, bounded reads and atomic writes, reading
params.yaml and the base of every stage's settings model (`params`, `strict`), the codec
names, the data set's columns, sources.yaml, and the Parquet layouts every reader of the
convert stage's files checks (`parquet`, the one module here that needs pyarrow). Core
imports nothing else of the project; what one stage alone uses, its settings model
included, lives beside that stage."""
