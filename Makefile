# Every target installs what it needs first, so a fresh machine only needs `make test` or `make lab`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
APT_PACKAGES := graphviz

.PHONY: install system-packages test bench lab clean

system-packages:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[dev,lab]"
	touch $(STAMP)

install: system-packages $(STAMP)

test: install
	$(PY) -m pytest -q -rs

bench: install
	$(PY) benchmarks/run.py

lab: install
	$(VENV)/bin/jupyter lab notebooks/quickstart.ipynb

clean:
	rm -rf $(VENV) build .pytest_cache
