# tessera — every target installs what it needs; `make demo` and `make test` are the contract.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Stable cache outside the checkout, so a fresh clone reuses Go modules, the Go build cache and the harness.
TESSERA_CACHE ?= $(HOME)/.cache/tessera
export TESSERA_CACHE
export GOMODCACHE ?= $(TESSERA_CACHE)/go/mod
export GOCACHE ?= $(TESSERA_CACHE)/go/build
export GOTOOLCHAIN := local
export GOWORK := off
export GOFLAGS := -mod=readonly

.PHONY: all venv lint unit e2e test harness node image demo demo-down proto bench bench-scale soak mutation clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy driver kubeletplugin controller tessera hack benchmarks
	$(PY) -m hack.import_cycles

unit: $(STAMP)
	$(PY) -m pytest -q tests

# The e2e harness: one Go binary built from Kubernetes' own modules, cached by content hash.
harness:
	@bash e2e/harness/build.sh

# What a real node runs (kubelet v1.36.3, containerd 2, runc shim, pause; runc/CNI/busybox from Debian),
# cached by content hash like the harness. Real nodes need root; without it e2e and the demo say why
# and use the kubelet stand-in.
node:
	@if [ "$$(id -u)" = 0 ]; then bash e2e/node/build.sh; else echo "node: not root, real nodes are skipped"; fi

# tessera's OCI image without Docker or a registry (mmdebstrap + pinned wheels, needs root), cached by content hash
# under $(TESSERA_CACHE)/image; prints the archive to import into a node's containerd and the image reference.
# IMAGE_TAG=x names it tessera.local/tessera:x (default: <chart appVersion>-<content hash>). docs/operations.md.
IMAGE_TAG ?=
image: $(STAMP)
	@PYTHON=$(PY) bash hack/image/build.sh --print-path --print-ref $(if $(IMAGE_TAG),--tag $(IMAGE_TAG))

NODE_ENV = TESSERA_HARNESS="$$(bash e2e/harness/build.sh --print-path)" \
	TESSERA_NODE_BIN="$$(if [ "$$(id -u)" = 0 ]; then bash e2e/node/build.sh --print-path; fi)"

e2e: $(STAMP) harness node
	$(NODE_ENV) $(PY) -m pytest -q e2e

test: lint unit e2e

proto: $(STAMP)
	$(PY) -m proto.generate

demo: $(STAMP) harness node
	$(NODE_ENV) $(PY) -m e2e.demo up

demo-down: $(STAMP)
	$(PY) -m e2e.demo down

bench: $(STAMP) harness node
	$(NODE_ENV) $(PY) -m benchmarks.run

# tessera on a kwok cluster of 1,000 GPU nodes (benchmarks/scale, BENCHMARKS.md "Scale"): about 15 minutes on
# 2 cores, about 12 GiB of memory at its peak; not part of `make test`. It builds kwok (benchmarks/scale/
# build-kwok.sh, cached like the harness) and stops cleanly under --min-free-gib. SCALE_ARGS for variants,
# e.g. SCALE_ARGS="--nodes 1000 --dgx-mig static --webhook-reference".
SCALE_ARGS ?= --nodes 1000
bench-scale: $(STAMP) harness
	@bash benchmarks/scale/build-kwok.sh
	TESSERA_HARNESS="$$(bash e2e/harness/build.sh --print-path)" $(PY) -m benchmarks.scale $(SCALE_ARGS)

soak: $(STAMP) harness
	TESSERA_HARNESS="$$(bash e2e/harness/build.sh --print-path)" $(PY) -m e2e.soak

# Mutation testing (mutmut, configured in pyproject's [tool.mutmut]) of kubeletplugin/state.py, claimdevices.py,
# recovery.py, checkpoint.py, driver/config.py and controller/checks/multicard.py against their own tests.
# Slow (most of an hour on 2 cores), so not part of `make test`; docs/reliability.md has the score.
MUTMUT_CHILDREN ?= 2
mutation: $(STAMP)
	$(PY) -m pip install --quiet 'mutmut==3.8.1'
	$(VENV)/bin/mutmut run --max-children $(MUTMUT_CHILDREN)
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache mutants
