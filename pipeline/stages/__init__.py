"""One module per DVC stage (fetch, csvdata, convert, codecs, shard, bench, train, summary,
report), each a plain function with paths and params in and files out, plus the formats
they read (`idx`, `parquet`). `python -m pipeline <stage>` calls them; dvc.yaml runs them."""
