"""One folder per DVC stage that has more than one concern (fetch/, convert/, shard/,
train/, report/: the stage, its settings model, its engines), one module per other stage
(csvdata, codecs, summary, machine, params: the check of every settings model), and what
several stages share (mnist: MNIST's files and sample; ray_cluster and engine_settings: the
Ray engine). `python -m pipeline <stage>` calls them; dvc.yaml runs them."""
