# The image cluster/kubernetes/pytorchjob.yaml and trainjob.yaml run: this repository at
# /workspace/ddp-course, its requirements installed as `make` installs them (torch alone from
# PyTorch's CPU wheel index, the rest from PyPI at the versions of constraints.txt), the course's
# package built and installed as tests/test_install.py builds it, run as a user without root.
#   docker build -t ddp-course:latest .
# then push it to a registry the cluster pulls from, and name that in the manifests' `image`.
# tests/test_manifests.py checks that every file named here exists and is copied before use.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
WORKDIR /workspace/ddp-course

# The dependencies first, in a layer of their own: a change to the course's code rebuilds only
# what follows. requirements.txt's last line (-e .) needs the sources, installed below instead.
COPY requirements.txt constraints.txt ./
RUN pip install --index-url https://download.pytorch.org/whl/cpu --no-deps "$(grep -E '^torch==' requirements.txt)" \
    && grep -v -E '^-e ' requirements.txt > /tmp/dependencies.txt \
    && pip install -r /tmp/dependencies.txt -c constraints.txt "setuptools>=70.1" \
    && rm /tmp/dependencies.txt

# the course's user owns its folder (WORKDIR made it root's): it writes har/'s caches and,
# without a volume there, checkpoints/
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin course \
    && chown 1000:1000 /workspace/ddp-course
COPY --chown=1000:1000 . .
RUN pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /tmp/wheels . \
    && pip install --no-deps --no-index /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels build ./*.egg-info

# A numeric user, so that Kubernetes' runAsNonRoot can tell it is not root.
USER 1000
# UCI HAR's features recomputed from the recordings once, into har/, not at every pod's start
RUN python -m helpers.data --data recordings
