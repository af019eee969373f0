# Two commands set everything up on a fresh machine:
#   make demo   creates or reuses .venv, installs, runs the main job on the embedded demo data
#   make test   creates or reuses .venv, installs with the dev extra, runs ruff and pytest
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test install install-dev bench clean

# The stamp files re-run pip only when pyproject.toml or constraints.txt change.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e ".[dev,export]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

SR := runs/streamrec_demo
TR := runs/translate_demo
demo: $(VENV)/.installed
	@echo "== StreamRec: demo data, training, test (model vs most-popular), batch scoring, explanations =="
	$(PY) data/make_streamrec_demo.py
	$(PY) -m streamrec fit --config configs/streamrec/demo.yaml --overwrite
	$(PY) -m streamrec test --config configs/streamrec/demo.yaml --ckpt_path $(SR)/checkpoints/best.ckpt
	$(PY) -m streamrec.score --ckpt $(SR)/checkpoints/best.ckpt --input data/streamrec_demo/interactions.csv \
		--output $(SR)/recs.parquet --top-k 10 --explain
	$(PY) -m streamrec.explain --ckpt $(SR)/checkpoints/best.ckpt --input data/streamrec_demo/interactions.csv \
		--user u0001 --html $(SR)/why_u0001.html --items data/streamrec_demo/items.csv
	@echo "== Translate: demo corpus, training, test BLEU (beam 5), inference with alignments =="
	$(PY) data/make_translate_demo.py
	$(PY) -m translate fit --config configs/translate/demo.yaml --overwrite
	$(PY) -m translate test --config configs/translate/demo.yaml --ckpt_path $(TR)/checkpoints/best.ckpt
	$(PY) -m translate.infer --ckpt $(TR)/checkpoints/best.ckpt -i data/translate_demo/test.en -o $(TR)/test.out.de \
		--alignments $(TR)/test.align.jsonl --html $(TR)/alignments.html

# One pytest worker per core (pytest-xdist); what many tests share is built once per run (tests/conftest.py).
# Bytecode is written even where the environment says not to: the tests start many interpreters, and each would
# compile the package again.
test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n auto --dist worksteal

# Kernel micro-benchmarks of core, each against the PyTorch path it replaces, in one run (a few minutes).
bench: $(VENV)/.installed
	$(PY) benchmarks/attention.py --lengths 128 512 1024
	$(PY) benchmarks/linear.py
	$(PY) benchmarks/dropout.py

clean:
	rm -rf $(VENV) lightning_logs runs .pytest_cache .ruff_cache

# Peer venv for benchmarks/streamrec_rectools.py (RecTools pins numpy<2 and Lightning<=2.5.2, so not in .venv).
.PHONY: bench-env-rectools
bench-env-rectools: .venv-rectools/.installed
.venv-rectools/.installed: benchmarks/envs/rectools.sh benchmarks/envs/_peer_venv.sh pyproject.toml constraints.txt
	VENV=.venv-rectools PYTHON=$(PYTHON) bash benchmarks/envs/rectools.sh
	touch $@

# Peer venv for benchmarks/translate_speed.py (Hugging Face transformers and CTranslate2: benchmark-only, not in .venv).
.PHONY: bench-env-translate
bench-env-translate: .venv-translate/.installed
.venv-translate/.installed: benchmarks/envs/translate.sh benchmarks/envs/_peer_venv.sh pyproject.toml constraints.txt
	VENV=.venv-translate PYTHON=$(PYTHON) bash benchmarks/envs/translate.sh
	touch $@
