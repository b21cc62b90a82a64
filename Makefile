# `make reproduce`, `make test` and `make lab` create .venv on first use and install
# requirements.txt into it (torch is pinned to the CPU build; `helpers` is installed editable).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# The notebooks are checked against the stand-in, planned as on the 2-core reference machine
# (DDP_COURSE_CORES=2), so that their outputs are the same on bigger machines too.
CHECKED := HAR_DATA=standin DDP_COURSE_CORES=2
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg
# The notebooks that train are checked a second time, against the same committed outputs, on a
# simulated other processor: ATen's kernels without AVX2/AVX-512 and MKL's compatible code path
# round differently, as another CPU would (tests/test_other_processor.py checks that they do).
OTHER_PROCESSOR := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
TRAINING_NOTEBOOKS := $(filter-out notebooks/01_% notebooks/02_%,$(wildcard notebooks/[0-9][0-9]_*.ipynb))

.PHONY: reproduce test lab lint notebooks clean-data

$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

## reproduce: the reference experiment (pass options with ARGS="--workers 1 2 --data standin")
reproduce: $(INSTALLED)
	$(PY) -m helpers.reproduce $(ARGS)

## test: unit tests, every notebook re-executed and compared with nbval, the training ones again on a simulated other processor
test: $(INSTALLED)
	$(PY) -m ruff check .
	$(CHECKED) $(PY) -m pytest tests notebooks $(NBVAL) $(ARGS)
	$(CHECKED) $(OTHER_PROCESSOR) $(PY) -m pytest $(NBVAL) $(TRAINING_NOTEBOOKS) $(ARGS)

## lab: JupyterLab on notebooks/
lab: $(INSTALLED)
	$(VENV)/bin/jupyter lab notebooks/

## notebooks: re-execute every notebook in place on the stand-in (commit the result)
notebooks: $(INSTALLED)
	for nb in notebooks/[0-9][0-9]_*.ipynb; do \
		$(CHECKED) $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.record_timing=False "$$nb" || exit 1; \
	done
