"""One module per DVC stage (fetch, csvdata, convert, codecs, shard, bench, train, summary,
report), each a plain function with paths and params in and files out, plus the formats
they read (`idx`, `idxheader`). Beside each stage that has settings, its section's model
(`<stage>_settings`); `params`, the first stage, checks the whole file with them all.
`python -m pipeline <stage>` calls them; dvc.yaml runs them."""
