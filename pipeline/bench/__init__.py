"""The training ladder: the write-up's Datasets and model, each rung's data path, the runners
that time the steps, and the ladder that runs them all (`ladder.run_bench`)."""
