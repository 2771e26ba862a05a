CONFIG ?= cluster.yaml
PY ?= python3
BASE_IMAGE ?= hellohal2064/vllm-qwen3.5-gb10:latest
IMAGE ?= vllm-compose:dev

.PHONY: setup compose image test lint demo up down

setup:  ## install the engine, Compose v2 and Python deps; start dockerd
	bash scripts/setup.sh

compose:  ## render compose/<name>/<node>/ for every node of $(CONFIG)
	vllm-compose render $(CONFIG)

image:  ## build the wrapper image over $(BASE_IMAGE)
	docker build --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

lint:
	ruff check generator tests
	mypy

test: setup  ## set up, then run the whole suite on a real engine
	$(PY) -m pytest
