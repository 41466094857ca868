# Every target installs what it needs first, so a fresh machine only needs `make test` or `make lab`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
APT_PACKAGES := graphviz chromium fonts-liberation
NOTEBOOKS := $(wildcard notebooks/*.ipynb)

.PHONY: install system-packages torchvision-hook zoo lint test test-torch screenshots bench lab demo fuzz clean

system-packages:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	test -x /usr/bin/chromium || missing="$$missing chromium"; \
	dpkg -s fonts-liberation >/dev/null 2>&1 || missing="$$missing fonts-liberation"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[dev,lab,zoo]"
	$(MAKE) --no-print-directory torchvision-hook
	touch $(STAMP)

# Another torch release in a venv of its own (.venvs/torch-X): PyPI's Linux wheels (CUDA builds that
# run on the CPU), bypassing this machine's pip cap (/etc/xdg/pip) with constraints files of the venv's
# own: one that pins that release, and an empty one for the `pip install .` check.
# torchvision (for timm) comes paired with the release where PyPI has a pairing; otherwise the newest
# one is installed without its torch pin and tests/support/torchvision_hook.py lets it import.
TORCH ?=
TORCH_VENV := .venvs/torch-$(TORCH)
TORCH_PY := $(TORCH_VENV)/bin/python
TORCH_STAMP := $(TORCH_VENV)/.installed

$(TORCH_VENV)/.installed: pyproject.toml
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=2.15.0"; exit 2; }
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	echo "torch==$(TORCH)" > $(TORCH_VENV)/constraints.txt
	$(TORCH_PY) -m pip install -q --upgrade pip
	PIP_CONSTRAINT=$(TORCH_VENV)/constraints.txt $(TORCH_PY) -m pip install -q "torch==$(TORCH)"
	@# The product as users install it beside the torch they have, with no pin: pip must keep that torch.
	@# An empty constraints file replaces this machine's cap (an empty PIP_CONSTRAINT does not).
	: > $(TORCH_VENV)/unpinned.txt
	PIP_CONSTRAINT=$(TORCH_VENV)/unpinned.txt $(TORCH_PY) -m pip install -q .
	$(TORCH_PY) -c "import importlib.metadata as m, sys; v = m.version('torch'); \
		sys.exit(0 if v.split('+')[0] == '$(TORCH)' else f'pip install . replaced torch $(TORCH) with {v}')"
	export PIP_CONSTRAINT=$(TORCH_VENV)/constraints.txt; \
	{ $(TORCH_PY) -m pip install -q torchvision 2>/dev/null \
	  || { echo "no torchvision release pairs with torch $(TORCH): the newest, without its torch pin"; \
	       $(TORCH_PY) -m pip install -q --no-deps torchvision; }; } && \
	$(TORCH_PY) -m pip install -q -e ".[dev,lab]" && \
	$(TORCH_PY) -m pip install -q --no-deps timm
	$(MAKE) --no-print-directory torchvision-hook PY=$(TORCH_PY)
	$(TORCH_PY) -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"
	touch $@

# The engine suites on that release: tests/explorer, the fuzz tests at their CI count, the docs'
# examples, the smoke runs of the scripts a lent GPU runs (its image has torch 2.11), and the
# explorer's widget tests that need no browser.
test-torch: system-packages $(TORCH_VENV)/.installed
	$(TORCH_PY) -m pytest -q -rs -p no:cacheprovider -m "not browser and not pinned" \
		tests/explorer tests/fuzz tests/test_docs.py tests/test_gpu_scripts.py tests/widgets

# PyPI's torchvision is a CUDA build whose C ops do not load beside CPU torch, and its import then
# fails; the hook declares the two op schemas it needs (see tests/support/torchvision_hook.py).
torchvision-hook:
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	cp tests/support/torchvision_hook.py $$site/deferred_explorer_torchvision_hook.py; \
	echo "import deferred_explorer_torchvision_hook; deferred_explorer_torchvision_hook.install()" \
		> $$site/deferred_explorer_torchvision_hook.pth

install: system-packages $(STAMP)

# ruff and mypy first (seconds): a finding fails the run before the suite starts.
lint: install
	$(VENV)/bin/ruff check explorer widgets
	$(VENV)/bin/ruff format --check explorer widgets
	$(VENV)/bin/mypy

test: install lint
	$(PY) -m pytest -q -rs

# The screenshots docs/*.png and the README show, taken by the browser tests that drive those views
# (`make test` saves them under build/screenshots/ and leaves the tree as it was).
screenshots: install
	EXPLORER_DOC_SCREENSHOTS=1 $(PY) -m pytest -q -p no:cacheprovider \
		tests/widgets/test_browser_forward.py tests/widgets/test_browser_init.py tests/widgets/test_browser_train.py \
		tests/widgets/test_browser_plan.py

# Differential fuzzing beyond the CI budget: FUZZ_EXAMPLES programs from FUZZ_SEED. Without
# FUZZ_SEED a new seed is drawn and printed, before and after the run, so a failure can be replayed
# (`make test` keeps its fixed, derandomized sample).
FUZZ_EXAMPLES ?= 2000
fuzz: install
	@seed=$${FUZZ_SEED:-$$($(PY) -c 'import secrets; print(secrets.randbelow(2**32))')}; \
	echo "fuzz: $(FUZZ_EXAMPLES) programs from seed $$seed (replay: make fuzz FUZZ_SEED=$$seed)"; \
	EXPLORER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) EXPLORER_FUZZ_SEED=$$seed \
		$(PY) -m pytest -q -p no:cacheprovider tests/fuzz --hypothesis-show-statistics; \
	status=$$?; echo "fuzz: seed $$seed, exit $$status (replay: make fuzz FUZZ_SEED=$$seed)"; exit $$status

# Every timm model and transformers architecture built deferred (about 30 min on 2 cores, not in
# `make test`); writes build/zoo/report.md. Then the init audit of a sample (which tensors a model
# leaves uninitialized, each claim confirmed eagerly): build/zoo/init_report.md.
# ZOO_ARGS="--only timm --limit 50" runs a part.
zoo: install
	$(PY) -m tests.zoo.coverage $(ZOO_ARGS)
	$(PY) -m tests.zoo.init_audit $(ZOO_ARGS)

bench: install
	$(PIP) install -q -c constraints.txt -e ".[dev,lab,zoo,bench]"
	$(PY) benchmarks/run.py

lab: install
	$(VENV)/bin/jupyter lab notebooks/quickstart.ipynb

# Executes every notebook headless; build/notebooks/*.html keep the widgets' saved state.
demo: install
	$(VENV)/bin/jupyter nbconvert --to html --execute --ExecutePreprocessor.store_widget_state=True \
		--ExecutePreprocessor.timeout=600 --output-dir build/notebooks $(NOTEBOOKS)

clean:
	rm -rf $(VENV) build .pytest_cache
