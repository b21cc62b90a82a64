# `make` alone lists the targets. Each of the others creates .venv on first use and installs
# requirements.txt into it (`helpers` editable), at the versions of constraints.txt (what the
# committed notebooks were checked with). torch is pinned to 2.13.0; on Linux it comes from
# PyTorch's CPU wheel index (the 2.13.0+cpu build, which satisfies ==2.13.0), since PyPI's Linux
# wheel is the CUDA build, with several GB of NVIDIA libraries this CPU course never uses; macOS
# gets PyPI's wheel, the CPU build there. That index serves torch alone (a first pip call, without
# torch's dependencies); everything else comes from PyPI. `make TORCH_INDEX=` leaves the index
# out, and so does an install that cannot reach it (an offline machine: pip would retry it for
# minutes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)
ifeq ($(shell uname -s),Linux)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
# The notebooks are checked on the recordings (real data that installs offline), planned as on
# the 2-core reference machine (DDP_COURSE_CORES=2), so that bigger machines check the same outputs.
CHECKED := HAR_DATA=recordings DDP_COURSE_CORES=2
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg
# The notebooks that train are checked a second time, against the same committed outputs, on a
# simulated other processor: ATen's kernels without AVX2/AVX-512 and MKL's compatible code path
# round differently, as another CPU would (tests/test_other_processor.py checks that they do).
OTHER_PROCESSOR := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
NOTEBOOKS := $(wildcard notebooks/[0-9][0-9]_*.ipynb)
TRAINING_NOTEBOOKS := $(filter-out notebooks/01_% notebooks/02_%,$(NOTEBOOKS))
# The second pass runs about twice as slowly as the first (MKL's compatible path): the eleven
# notebooks at once would take some 40 minutes on 2 cores, twice `make test`'s budget of 20.
# `make test-other-processor` runs it: before committing a notebook (TRAINING_NOTEBOOKS="..." names
# some); .ci/run on 03 (the course's central claim: trainings on 1 and 2 workers compared, which
# rounding moves), 04, 09 and 11, the notebooks whose asserts rest most on rounding.

.PHONY: help reproduce test test-slow test-other-processor test-slurm test-browser lab warm notebooks normalise student timings grade hub-kernel hub-user

## help: list the targets, one line each
help:
	@awk '/^## [a-z-]+: /{t = $$2; sub(/:$$/, "", t); sub(/^## [a-z-]+: /, ""); printf "make %-10s  %s\n", t, $$0}' $(MAKEFILE_LIST)

$(INSTALLED): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifneq ($(TORCH_INDEX),)
	if $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/', timeout=5)" 2>/dev/null; \
	then $(PY) -m pip install -q --index-url $(TORCH_INDEX) --no-deps "$(TORCH_PIN)"; \
	else echo "note: $(TORCH_INDEX) cannot be reached; installing torch without it"; fi
endif
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

## reproduce: the reference experiment (pass options with ARGS="--workers 1 2 --data standin")
reproduce: $(INSTALLED)
	$(PY) -m helpers.reproduce $(ARGS)

## test: the unit tests, then every notebook re-executed and compared with nbval (about 20 minutes on 2 cores)
test: $(INSTALLED)
	$(PY) -m ruff check .
	$(CHECKED) $(PY) -m pytest tests notebooks $(NBVAL) $(ARGS)

## test-slow: the fault drills, timeouts, command-line refusals and end-to-end runs (about 12 minutes; CI runs them)
test-slow: $(INSTALLED)
	$(CHECKED) $(PY) -m pytest -m slow tests $(ARGS)

## test-other-processor: every notebook that trains, against its committed outputs, on the simulated other processor
test-other-processor: $(INSTALLED)
	$(CHECKED) $(OTHER_PROCESSOR) $(PY) -m pytest $(NBVAL) $(TRAINING_NOTEBOOKS) $(ARGS)

## test-slurm: cluster/slurm/train.sbatch on a real two-node Slurm cluster here (root; installs slurm-wlm and munge)
test-slurm: $(INSTALLED)
	@PATH="$$PATH:/usr/local/sbin:/usr/sbin:/sbin"; have() { command -v "$$1" >/dev/null 2>&1; }; \
	if have slurmctld && have slurmd && have munged && have sbatch; then :; \
	elif [ "$$(id -u)" = 0 ] && have apt-get; then \
		echo "test-slurm: installing Debian's slurm-wlm and munge with apt-get"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } \
			>/dev/null || echo "test-slurm: apt-get could not install slurm-wlm and munge"; \
	else echo "test-slurm: slurm-wlm and munge are missing; as root: apt-get install slurm-wlm munge"; \
	fi
	$(CHECKED) $(PY) -m pytest -m slurm tests/test_slurm.py -v -rs $(ARGS)

# The browser test drives Debian's chromium (CHROMIUM), never a browser that Playwright downloads:
# make installs it with apt-get where it runs as root, and otherwise says what to install. On a
# machine without Debian's package (GitHub's Ubuntu runners, whose chromium is a snap stub),
# `make test-browser CHROMIUM=playwright` has Playwright fetch its own build instead.
CHROMIUM ?= /usr/bin/chromium

## test-browser: the notebooks run in JupyterLab in headless Chromium, screenshots in results/browser/
test-browser: $(INSTALLED)
	$(PY) -m pip install -q -r requirements-browser.txt
ifeq ($(CHROMIUM),playwright)
	$(PY) -m playwright install --with-deps chromium
else
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi
	@test -x "$(CHROMIUM)" || { echo "make test-browser: no Chromium at $(CHROMIUM): install Debian's chromium (apt-get install chromium), pass CHROMIUM=/path/to/chromium, or CHROMIUM=playwright for Playwright's own build"; exit 1; }
endif
	$(CHECKED) DDP_COURSE_BROWSER=$(CHROMIUM) $(PY) -m pytest tests/browser -rxs $(ARGS)

## lab: JupyterLab on lab/, your own copy of notebooks/ (made on first use; notebooks/ stays as committed), on the recordings unless HAR_DATA is set
lab: $(INSTALLED)
	mkdir -p lab
	for nb in $(NOTEBOOKS); do test -e "lab/$${nb#notebooks/}" || cp "$$nb" lab/; done
	HAR_DATA=$${HAR_DATA:-recordings} $(VENV)/bin/jupyter lab lab/

## warm: before class: the venv, the data caches and first imports, so nothing downloads in class
warm: $(INSTALLED)
	$(PY) -m helpers.data
	$(PY) -m helpers.data --data recordings
	$(PY) -m helpers.data --data standin
	MPLBACKEND=Agg $(PY) -c "import matplotlib.pyplot, pandas, torch.distributed, helpers.dist.launch"

## notebooks: re-execute every notebook in place on the recordings, then normalise (commit the result)
notebooks: $(INSTALLED)
	for nb in $(NOTEBOOKS); do \
		$(CHECKED) $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.record_timing=False "$$nb" || exit 1; \
	done
	$(PY) -m helpers.notebook.tools normalise $(NOTEBOOKS)

## normalise: drop run timestamps and kernel noise from the notebooks, without re-executing them
normalise: $(INSTALLED)
	$(PY) -m helpers.notebook.tools normalise $(NOTEBOOKS)

## timings: time every notebook on the recordings, planning for CORES cores (default 2; it cannot add cores)
timings: $(INSTALLED)
	$(PY) -m helpers.notebook.timings --cores $(or $(CORES),2) $(NOTEBOOKS)

## student: the student edition in student/ (outputs cleared, solutions and grader checks removed)
student: $(INSTALLED)
	$(PY) -m helpers.notebook.tools student --out student $(NOTEBOOKS)

## grade: score a class's notebooks, make grade SUBMISSIONS=folder (grades/: CSV, report; COURSE.md)
grade: $(INSTALLED)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=folder [OUT=grades]"; exit 2; }
	HAR_DATA=$${HAR_DATA:-recordings} DDP_COURSE_CORES=$${DDP_COURSE_CORES:-2} \
		$(PY) -m helpers.notebook.grading "$(SUBMISSIONS)" --out "$(or $(OUT),grades)" $(ARGS)

## hub-kernel: register .venv as the Jupyter kernel ddp-course, HAR_DATA pinned (PREFIX=/usr/local: all users)
hub-kernel: $(INSTALLED)
	$(PY) -m ipykernel install --name ddp-course --display-name "Python 3 (ddp-course)" \
		$(if $(PREFIX),--prefix "$(PREFIX)",--user) --env HAR_DATA "$${HAR_DATA:-recordings}" \
		$(if $(HAR_ROOT),--env HAR_ROOT "$(HAR_ROOT)")

## hub-user: a student's own copy of student/ in DEST, on the ddp-course kernel (never overwrites)
hub-user:
	@test -n "$(DEST)" || { echo "usage: make hub-user DEST=/home/<student>/ddp-course"; exit 2; }
	@test -d student || { echo "no student/ here: run make student first"; exit 2; }
	$(PY) -m helpers.notebook.tools student --kernel ddp-course --keep-existing --out "$(DEST)" \
		$(wildcard student/[0-9][0-9]_*.ipynb)
