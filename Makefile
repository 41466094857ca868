# Every target installs what it needs first, so a fresh machine only needs `make test` or `make lab`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
APT_PACKAGES := graphviz chromium fonts-liberation
NOTEBOOKS := $(wildcard notebooks/*.ipynb)

.PHONY: install system-packages torchvision-hook zoo lint test bench lab demo fuzz clean

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
	$(PIP) install -q -c constraints.txt -e ".[dev,lab]"
	$(MAKE) --no-print-directory torchvision-hook
	touch $(STAMP)

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

# Differential fuzzing beyond the CI budget: FUZZ_EXAMPLES programs, FUZZ_SEED for another sample.
FUZZ_EXAMPLES ?= 2000
fuzz: install
	EXPLORER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(if $(FUZZ_SEED),EXPLORER_FUZZ_SEED=$(FUZZ_SEED)) \
		$(PY) -m pytest -q -p no:cacheprovider tests/fuzz --hypothesis-show-statistics

# Every timm model and transformers architecture built deferred (about 30 min on 2 cores, not in
# `make test`); writes build/zoo/report.md. Then the init audit of a sample (which tensors a model
# leaves uninitialized, each claim confirmed eagerly): build/zoo/init_report.md.
# ZOO_ARGS="--only timm --limit 50" runs a part.
zoo: install
	$(PY) -m tests.zoo.coverage $(ZOO_ARGS)
	$(PY) -m tests.zoo.init_audit $(ZOO_ARGS)

bench: install
	$(PIP) install -q -c constraints.txt -e ".[dev,lab,bench]"
	$(PY) benchmarks/run.py

lab: install
	$(VENV)/bin/jupyter lab notebooks/quickstart.ipynb

# Executes every notebook headless; build/notebooks/*.html keep the widgets' saved state.
demo: install
	$(VENV)/bin/jupyter nbconvert --to html --execute --ExecutePreprocessor.store_widget_state=True \
		--ExecutePreprocessor.timeout=600 --output-dir build/notebooks $(NOTEBOOKS)

clean:
	rm -rf $(VENV) build .pytest_cache
