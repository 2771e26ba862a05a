CONFIG ?= cluster.yaml
PY ?= python3
BASE_IMAGE ?= hellohal2064/vllm-qwen3.5-gb10:latest
IMAGE ?= vllm-compose:dev
BACKEND ?= ray

.PHONY: setup compose image test lint demo demo-down up watch down testbed testbed-down

setup:  ## install the engine, Compose v2 and Python deps; start dockerd
	bash scripts/setup.sh

compose:  ## render compose/<name>/<node>/ for every node of $(CONFIG)
	vllm-compose render $(CONFIG)

image:  ## build the wrapper image over $(BASE_IMAGE)
	docker build --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

lint:  ## ruff (lint and format) and strict mypy over every tree
	ruff check generator image tests benchmarks
	ruff format --check generator image tests benchmarks
	mypy

test: setup lint  ## set up, lint and type-check, then run the whole suite on a real engine
	$(PY) -m pytest

up:  ## render and start every node of $(CONFIG) over its Docker context
	vllm-compose up $(CONFIG)

watch:  ## keep $(CONFIG) serving: check it, recreate the whole group on failure, stop after the cap
	vllm-compose watch $(CONFIG)

down:  ## stop and remove the stack on every node of $(CONFIG)
	vllm-compose down $(CONFIG)

testbed:  ## emulated nodes: network namespaces with their own engines and contexts
	$(PY) -m tests.support.testbed up --nodes 2

testbed-down:
	$(PY) -m tests.support.testbed down

demo: setup  ## real vLLM, TP=2 over Ray across two emulated nodes, deployed by vllm-compose up (BACKEND=native: vLLM's own multi-node mode)
	$(PY) -m tests.support.demo up $(BACKEND)

demo-down:
	$(PY) -m tests.support.demo down
