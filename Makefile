CONFIG ?= cluster.yaml
VENV ?= .venv
PY ?= $(VENV)/bin/python
CLI ?= $(VENV)/bin/vllm-compose
BASE_IMAGE ?= hellohal2064/vllm-qwen3.5-gb10:latest
IMAGE ?= vllm-compose:dev
BACKEND ?= ray

.PHONY: setup compose image test lint demo demo-down up watch down testbed testbed-down

setup:  ## install the engine and Compose v2, the Python deps into $(VENV); start dockerd
	VENV=$(VENV) bash scripts/setup.sh

$(VENV)/.installed: pyproject.toml  # the Python part alone, for the targets that need only it
	VENV=$(VENV) bash scripts/setup.sh python

compose: $(VENV)/.installed  ## render compose/<name>/<node>/ for every node of $(CONFIG)
	$(CLI) render $(CONFIG)

image:  ## build the wrapper image over $(BASE_IMAGE)
	docker build --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

lint: $(VENV)/.installed  ## ruff (lint and format) and strict mypy over every tree
	$(PY) -m ruff check generator image tests benchmarks
	$(PY) -m ruff format --check generator image tests benchmarks
	$(PY) -m mypy

test: setup lint  ## set up, lint and type-check, then run the whole suite on a real engine
	$(PY) -m pytest

up: $(VENV)/.installed  ## render and start every node of $(CONFIG) over its Docker context
	$(CLI) up $(CONFIG)

watch: $(VENV)/.installed  ## keep $(CONFIG) serving: check it, recreate the whole group on failure, stop after the cap
	$(CLI) watch $(CONFIG)

down: $(VENV)/.installed  ## stop and remove the stack on every node of $(CONFIG)
	$(CLI) down $(CONFIG)

testbed: $(VENV)/.installed  ## emulated nodes: network namespaces with their own engines and contexts
	$(PY) -m tests.support.testbed up --nodes 2

testbed-down: $(VENV)/.installed
	$(PY) -m tests.support.testbed down

demo: setup  ## real vLLM, TP=2 over Ray across two emulated nodes, deployed by vllm-compose up (BACKEND=native: vLLM's own multi-node mode)
	$(PY) -m tests.support.demo up $(BACKEND)

demo-down: $(VENV)/.installed
	$(PY) -m tests.support.demo down
