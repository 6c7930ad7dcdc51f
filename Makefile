# The two commands a newcomer needs: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: install demo test lint assets

install: $(VENV)/.installed

# `make demo PORT=8090 DATA_DIR=/tmp/fl` passes them on; empty means faultline's defaults.
PORT ?=
DATA_DIR ?=
demo: $(VENV)/.installed
	$(VENV)/bin/faultline demo $(if $(PORT),--port $(PORT)) $(if $(DATA_DIR),--data-dir $(DATA_DIR))

# lint-imports checks the import contracts in pyproject.toml; the graph builds in a second, so no cache folder.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(VENV)/bin/python -m pytest

# The web UI's front-end files come from npm (service/ui/assets/package.json) and are committed under
# service/ui/static/vendor, so installs need no npm and browsers no CDN. Run after changing a version there.
assets:
	npm ci --prefix service/ui/assets --no-audit --no-fund
	cp service/ui/assets/node_modules/htmx.org/dist/htmx.min.js service/ui/static/vendor/htmx.min.js
	cp service/ui/assets/node_modules/htmx.org/LICENSE service/ui/static/vendor/htmx.LICENSE
