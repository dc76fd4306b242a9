# Two entry points: `make repro` (the real pipeline) and `make test` (the suite).
# Both create .venv on first use; nothing is assumed beyond Python 3.10+ and git.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build; on a CUDA machine use e.g. TORCH_SPEC='torch==2.13.0' with PyTorch's CUDA index.
TORCH_SPEC ?= torch==2.13.0
# PIPELINE_MIRROR, when set (e.g. `make repro PIPELINE_MIRROR=/data/idx`), is a folder or URL
# holding <dataset>/ with the raw files, tried before the internet mirrors of sources.yaml.
export PIPELINE_MIRROR

.PHONY: setup data repro bench bench-quick publish recover test test-fast check check-docs readme-walk mutants plots plots-template clean peers peers-setup

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

repro: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc repro
	PATH="$(abspath $(BIN)):$$PATH" dvc metrics show

# The data stages alone (fetch, CSV, Parquet, shards): the pipeline up to the bench.
data: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc repro shard@mnist shard@fashion-mnist

# Re-measure on purpose: the bench of both data sets reruns on this machine even where its
# fingerprint matches the committed figures; the summary and report follow, then `publish`.
# The code lists first: a stage run alone (-s) reads its list as it is, and an edit of the
# bench's code would otherwise rerun it again in the `dvc repro` after.
# Then commit dvc.lock, metrics/, results/, docs/ and README.md together.
bench: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc repro code
	PATH="$(abspath $(BIN)):$$PATH" dvc repro -f -s bench@mnist bench@fashion-mnist
	PATH="$(abspath $(BIN)):$$PATH" dvc repro
	$(MAKE) publish
	PATH="$(abspath $(BIN)):$$PATH" dvc metrics show

# Maintainers: the pages a reader sees (the README's generated blocks, docs/results.md and
# docs/img) rendered from the committed metrics/ and results/. The pipeline's own `report`
# stage writes only data/report/, so a user's run never changes a tracked page.
publish: setup
	$(BIN)/python -m pipeline report --bench metrics/bench --codecs metrics/codecs.json --results results \
		--readme README.md --page docs/results.md --images docs/img \
		--ladder-plot metrics/ladder.csv --budget-plot metrics/budget.csv

# The shape of the answer within BUDGET_MIN minutes (`bench.quick`, every data set together), run
# as an experiment in a scratch copy (.dvc/tmp/exps/tmp*): the workspace and the committed
# figures stay as they are; `dvc exp show` lists it beside them and `dvc exp apply bench-quick`
# puts it in the tables (marked quick there). Stopped or failed, the data sets that finished are
# kept in data/bench-quick/ and the scratch copy this run made is removed (tools/bench_quick.py).
BUDGET_MIN ?= 10
bench-quick: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python tools/bench_quick.py --budget-min $(BUDGET_MIN)

# After an interrupted `dvc repro` left dvc.lock cut short ("validation failed" from every dvc
# command): the committed dvc.lock back, then `make repro` redoes what it no longer records.
recover:
	git checkout -- dvc.lock
	@echo "dvc.lock restored from the last commit; run 'make repro' to bring the outputs and it up to date"

# The product's tests, on any workspace (whole, partial or interrupted runs of the pipeline
# included). test-fast leaves out the tests marked slow (training, dvc, torchrun).
test: setup
	PATH="$(abspath $(BIN)):$$PATH" python -m pytest -q -m "not docs" $(PYTEST_ARGS)

test-fast: setup
	PATH="$(abspath $(BIN)):$$PATH" python -m pytest -q -m "not docs and not slow" $(PYTEST_ARGS)

# The style: the linter (errors, unused and unsorted imports) and the formatter's check
# ([tool.ruff] in pyproject.toml); `.venv/bin/ruff format . && .venv/bin/ruff check --fix .` apply them.
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The project's own documents against its committed files (generated blocks, recorded
# outputs, prose rules): a CI step on a clean clone; on a workspace where the pipeline
# re-measured something, `make publish` first.
check-docs: setup
	PATH="$(abspath $(BIN)):$$PATH" python -m pytest -q -m docs $(PYTEST_ARGS)

# The README's commands as a newcomer types them, in a fresh clone and a new shell with no venv
# (tools/readme_walk.py): a CI step. BUDGET_MIN=3 keeps its quick bench short.
readme-walk:
	$(PYTHON) tools/readme_walk.py

# Mutation testing (not part of CI: hours on 2 cores for every module). Which modules and tests:
# [tool.mutmut] in pyproject.toml. Starts fresh: mutmut keeps a mutant's verdict until its
# function changes, so after new tests old survivors would be reported unchecked (resume a
# stopped run with `mutmut run`). The score table goes to results/mutation/score.md, which
# docs/results.md embeds (`make publish` refreshes it).
# MUTANTS="pipeline.shards.mapped*" runs only the mutants whose names match; the table keeps
# the earlier table's rows for the modules left out, marked with that run's commit and with "same code"
# or "code changed since" (git, the module's file).
MUTMUT_CHILDREN ?= $(shell nproc)
MUTANTS ?=
mutants: setup
	rm -rf mutants
	@start=$$(date +%s); \
	PATH="$(abspath $(BIN)):$$PATH" mutmut run --max-children $(MUTMUT_CHILDREN) $(MUTANTS) || exit $$?; \
	mkdir -p results/mutation; \
	$(BIN)/python tools/mutation_score.py --seconds $$(( $$(date +%s) - start )) --keep results/mutation/score.md \
		> results/mutation/score.md.new && mv results/mutation/score.md.new results/mutation/score.md; \
	cat results/mutation/score.md

# Renders dvc_plots/index.html offline (vega is inlined in .dvc/plots/offline.html).
plots: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc plots show

# Maintainers only: refetch the pinned vega builds with npm and rewrite the page template.
plots-template: setup
	$(BIN)/python tools/plots_template.py

# The race against the loaders users pick (benchmarks/peers.py): its own virtual environment,
# so the project's torch is untouched (the peers pull torchvision and would pull another
# torch). torch is installed first and pinned for the rest; a peer that does not install is
# reported and left out of the race. Results: results/peers/*.json and results/peers/table.md.
PEERS_VENV := .venv-peers
PEERS ?= litdata==0.2.76 mosaicml-streaming==0.13.0 webdataset==1.0.2 pylance==14.0.2
PEERS_ARGS ?= --scales 1 10
peers-setup: $(PEERS_VENV)/.installed

$(PEERS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PEERS_VENV)/bin/python -m pip freeze | grep -i '^torch==' > $(PEERS_VENV)/constraints.txt
	$(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(PEERS_VENV)/constraints.txt -e ".[shards]"
	for peer in $(PEERS); do \
	  $(PEERS_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(PEERS_VENV)/constraints.txt "$$peer" \
	    || echo "peers: $$peer did not install; the race runs without it" >&2; \
	done
	touch $@

peers: peers-setup
	$(PEERS_VENV)/bin/python benchmarks/peers.py $(PEERS_ARGS) --out results/peers
	$(BIN)/python tools/record_commands.py --refill

clean:
	rm -rf $(VENV) $(PEERS_VENV) .pytest_cache mutants
