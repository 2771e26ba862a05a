"""A corpus of broken and hostile configs, run through the command line as a user would: each is
refused with one line per problem naming the field, exit code 2, and nothing on disk written or
changed. Then the other half: legitimate values that merely look dangerous reach the running
container exactly as written (engine test)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_docker.plugin import Services
from python_on_whales import DockerClient

from generator import cli as commands
from tests.support import images
from tests.support.clusters import cli
from tests.test_config import BASE
from tests.test_render import HOSTILE


def r(a: str, b: str) -> str:
    return BASE.replace(a, b)


CASES: dict[str, str] = {
    # Hostile or careless input that used to pass or crash.
    "args-prefix-tensor-parallel": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--tensor-parallel', '4']}\n",
    "args-prefix-api-key": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--api-ke', 'KEY']}\n",
    "args-model": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--model=/other']}\n",
    "env-lowercase-secret": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {hf_token: x}\n",
    "env-ray-metrics-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {DASHBOARD_METRIC_PORT: '9'}\n",
    "port-octal": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 010}\n",
    "port-hex": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 0x1F90}\n",
    "port-5000-digits": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 99999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999}\n",
    "metrics-retention-too-long": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nmetrics: {retention: 99999999999y}\n",
    "metrics-retention-zero": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nmetrics: {retention: 0d}\n",
    "metrics-listen-other-node": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nmetrics: {listen: 10.0.0.2}\n",
    "interface-dotdot": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: '..'\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "roles-all-workers": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1, role: worker}\n  - {name: b, ip: 10.0.0.2, role: worker}\nmodel: {path: /models/m}\n",
    "args-spelling-tp": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['-tp=2']}\n",
    "args-spelling-pipeline-parallel-size": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--pipeline_parallel_size=2']}\n",
    "args-spelling-gpu-memory-utilization": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--gpu_memory_utilization=0.5']}\n",
    "args-spelling-max-model-len": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--max_model_len=4096']}\n",
    "args-spelling-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--port=8001']}\n",
    "args-spelling-served-model-name": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--served_model_name=m']}\n",
    "args-spelling-safetensors-load-strategy": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--safetensors_load_strategy=eager']}\n",
    "args-spelling-master-addr": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--master_addr=10.0.0.1']}\n",
    "args-spelling-node-rank": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--node_rank=1']}\n",
    "args-spelling-nnodes": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--nnodes=2']}\n",
    "args-spelling-master-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ['--master_port=29600']}\n",
    "env-secret-github-token": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {GITHUB_TOKEN: x}\n",
    "env-secret-wandb-api-key": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {WANDB_API_KEY: x}\n",
    "env-secret-ngc-api-key": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {NGC_API_KEY: x}\n",
    "env-secret-huggingface-token": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {HUGGINGFACE_TOKEN: x}\n",
    "env-secret-my-secret-value": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {MY_SECRET_VALUE: x}\n",
    "env-secret-slack-secret": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {SLACK_SECRET: x}\n",
    "env-secret-passwd": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {PASSWD: x}\n",
    "ip-loopback-other": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 127.1.2.3}\nmodel: {path: /models/m}\n",
    "ip-metadata": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 169.254.169.254}\nmodel: {path: /models/m}\n",
    "ip-multicast-admin": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 239.1.1.1}\nmodel: {path: /models/m}\n",
    "ip-reserved-250": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 250.0.0.1}\nmodel: {path: /models/m}\n",
    "ip-unspecified-head": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 0.0.0.0, role: head}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "port-is-custom-ray-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 6380}\nray: {port: 6380}\n",
    "port-is-custom-master-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nbackend: native\nvllm: {port: 8000, master_port: 8000}\n",
    "model-sys-class-x": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /sys/class/x}\n",
    "model-dev-shm-m": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /dev/shm/m}\n",
    "model-run-models": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /run/models}\n",
    "model-boot-x": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /boot/x}\n",
    "model-bin": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /bin}\n",
    "model-var": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /var}\n",
    "model-home": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /home}\n",
    "model-double-slash-etc": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: //etc}\n",
    "model-other-clusters-secrets": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /var/lib/vllm-compose/other}\n",
    "model-docker-data": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /var/lib/docker/x}\n",
    "yaml-merge-key": "base: &b {name: c}\nother:\n  <<: *b\n",
    "yaml-python-tag": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: !!python/object:os.system {}\n",
    "yaml-alias-in-list": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nx: &n 1\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\ny: [*n]\n",
    "yaml-too-large": BASE + "# " + "x" * (1 << 20) + "\n",
    "env-entrypoint-secrets-dir": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {VLLM_COMPOSE_SECRETS: /tmp}\n",
    "env-entrypoint-base-image": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {VLLM_COMPOSE_BASE_IMAGE: x}\n",
    "image-upper-case-path": "name: c\nimage: registry.io/Name/x:1\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "image-space-in-tag": "name: c\nimage: 'vllm/x:a b'\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "yaml-complex-key": "? [a, b]\n: c\n",
    "yaml-deep-nesting": "name: " + "[" * 3000 + "\n",
    "yaml-alias-bomb": "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\n",
    "yaml-anchor-in-config": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: &e {A: b}\n",
    "ip-unspecified": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 0.0.0.0}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "ip-loopback-two-nodes": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 127.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "ip-link-local": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 169.254.1.2}\nmodel: {path: /models/m}\n",
    "ip-multicast": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 224.0.0.5}\nmodel: {path: /models/m}\n",
    "ip-broadcast": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 255.255.255.255}\nmodel: {path: /models/m}\n",
    "ip-reserved": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 240.0.0.1}\nmodel: {path: /models/m}\n",
    "port-is-ray-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 6379}\nray: {port: 6379}\n",
    "port-is-master-port": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nbackend: native\nvllm: {port: 29501, master_port: 29501}\n",
    "port-in-ray-worker-ports": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {port: 10202}\n",
    "native-ranks-uneven": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2, gpus: 2}\nmodel: {path: /models/m}\nbackend: native\nvllm: {tensor_parallel_size: 3}\n",
    "model-root": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /}\n",
    "model-etc": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /etc/models}\n",
    "model-proc": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /proc/1}\n",
    "model-usr": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /usr}\n",
    "env-too-large": BASE
    + "env: {"
    + ", ".join(f"V{i}: '{'x' * 8000}'" for i in range(40))
    + "}\n",
    "env-entrypoint-name": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {VLLM_COMPOSE_WAIT_FOR: '10.0.0.1:6379'}\n",
    "env-secret-openai-key": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {OPENAI_API_KEY: sk-1}\n",
    "env-secret-aws": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {AWS_SECRET_ACCESS_KEY: x}\n",
    "env-secret-hf-api-token": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {HF_API_TOKEN: x}\n",
    "env-secret-password": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {DB_PASSWORD: x}\n",
    "env-nul": 'name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nenv: {A: "x\\0y"}\n',
    "args-nul": 'name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: ["--x\\0"]}\n',
    "args-underscore-tp": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: [--tensor_parallel_size, '2']}\n",
    "args-underscore-backend-equals": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: [--distributed_executor_backend=mp]}\n",
    "args-secret-underscore": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: [--api_key, sk-1]}\n",
    "args-secret-hf-token-equals": "name: c\nimage: vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\nvllm: {args: [--hf_token=hf_x]}\n",
    "image-upper-case-repository": "name: c\nimage: Vllm/vllm-openai:v0.32.0\ninterface: eth0\nnodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\nmodel: {path: /models/m}\n",
    "syntax-unclosed-flow": "name: [\n",
    "syntax-tab-indent": "name: c\nnodes:\n\t- {name: a}\n",
    "syntax-top-level-list": "- a\n- b\n",
    "syntax-empty-file": "",
    "syntax-duplicate-key": BASE + "name: d\n",
    "syntax-duplicate-key-in-node": r(
        "{name: a, ip: 10.0.0.1}", "{name: a, ip: 10.0.0.1, ip: 10.0.0.3}"
    ),
    "type-port-string": BASE + "vllm: {port: '30000x'}\n",
    "type-port-too-big": BASE + "vllm: {port: 70000}\n",
    "type-port-huge": BASE + "vllm: {port: 1000000000000000000000000000000}\n",
    "type-gpus-string": r("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: '2'}"),
    "type-gpus-zero": r("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: 0}"),
    "type-ip-invalid": r("10.0.0.2", "10.0.0.300"),
    "type-ip-number": r("ip: 10.0.0.2", "ip: 167772162"),
    "type-nodes-mapping": r(
        "nodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\n", "nodes: {a: 1}\n"
    ),
    "type-nodes-empty": r(
        "nodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\n", "nodes: []\n"
    ),
    "type-backend-unknown": BASE + "backend: mpi\n",
    "type-accelerator-unknown": BASE + "accelerator: tpu\n",
    "type-args-string": BASE + "vllm: {args: --enforce-eager}\n",
    "type-args-number": BASE + "vllm: {args: [--max-num-seqs, 8]}\n",
    "type-env-number": BASE + "env: {NCCL_DEBUG: 3}\n",
    "type-startup-timeout-low": BASE + "vllm: {startup_timeout: 5}\n",
    "type-utilization-above-one": BASE + "vllm: {gpu_memory_utilization: 1.5}\n",
    "unknown-top-level": BASE + "nodez: []\n",
    "unknown-node-key": r("ip: 10.0.0.2}", "ip: 10.0.0.2, ipp: 1}"),
    "unknown-vllm-key": BASE + "vllm: {tp: 2}\n",
    "dup-node-names": r("name: b,", "name: a,"),
    "dup-ips": r("10.0.0.2", "10.0.0.1"),
    "dup-contexts": r("ip: 10.0.0.2}", "ip: 10.0.0.2, context: a}"),
    "dup-heads": r("ip: 10.0.0.1}", "ip: 10.0.0.1, role: head}").replace(
        "ip: 10.0.0.2}", "ip: 10.0.0.2, role: head}"
    ),
    "parallel-tp-too-big": BASE + "vllm: {tensor_parallel_size: 4}\n",
    "parallel-pp-too-big": BASE + "vllm: {pipeline_parallel_size: 3}\n",
    "inject-name-newline": r("name: c\n", 'name: "c\\nservices: {}"\n'),
    "inject-name-shell": r("name: c\n", "name: 'c; rm -rf /'\n"),
    "inject-name-compose-interpolation": r("name: c\n", "name: '${HOME}'\n"),
    "inject-node-traversal": r("name: a,", "name: ../etc,"),
    "inject-node-slash": r("name: a,", "name: a/b,"),
    "inject-node-interpolation": r("name: a,", "name: '${USER}',"),
    "inject-context-shell": r("ip: 10.0.0.2}", "ip: 10.0.0.2, context: '$(reboot)'}"),
    "inject-interface-shell": r("interface: eth0", "interface: 'eth0; reboot'"),
    "inject-image-space": r("vllm/vllm-openai:v0.32.0", "'vllm openai'"),
    "inject-image-newline": r("vllm/vllm-openai:v0.32.0", '"vllm\\nprivileged: true"'),
    "inject-model-relative": r("/models/m", "models/m"),
    "inject-model-traversal": r("/models/m", "/models/../etc"),
    "inject-model-colon": r("/models/m", "/models/m:/etc"),
    "inject-model-newline": r("/models/m", '"/models/m\\n  privileged: true"'),
    "inject-env-key-space": BASE + "env: {'A B': x}\n",
    "inject-env-key-equals": BASE + "env: {'A=B': x}\n",
    "inject-env-per-node": BASE + "env: {NCCL_SOCKET_IFNAME: eth1}\n",
    "vllm-config-root-with-ray": BASE + "env: {VLLM_CONFIG_ROOT: /x}\n",
    "inject-args-named-flag": BASE + "vllm: {args: [--tensor-parallel-size, '8']}\n",
    "secret-in-env": BASE + "env: {VLLM_API_KEY: sk-123}\n",
    "secret-on-command-line": BASE + "vllm: {args: [--api-key, sk-123]}\n",
    "secret-ray-token-in-env": BASE + "env: {RAY_AUTH_TOKEN: t0k}\n",
    "ray-auth-off-by-env": BASE + "env: {RAY_AUTH_MODE: disabled}\n",
    "huge-name": r("name: c\n", "name: " + "c" * 10000 + "\n"),
    "huge-env-value": BASE + "env: {X: '" + "v" * 10000 + "'}\n",
    "huge-args": BASE + "vllm: {args: [" + ", ".join(["--x"] * 300) + "]}\n",
    "huge-nodes": r(
        "nodes:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\n",
        "nodes:\n"
        + "".join(f"  - {{name: n{i}, ip: 10.0.{i // 250}.{i % 250 + 1}}}\n" for i in range(100)),
    ),
}

# The first problem line each must give (the field, then why).
FIRST = {
    "args-prefix-tensor-parallel": "vllm.args.0: --tensor-parallel has a named field (tensor_parallel_size); set it there",
    "args-prefix-api-key": "vllm.args.0: a secret on the command line shows in `ps` and `docker inspect`; use secrets.api_key_file / secrets.hf_token_file",
    "args-model": "vllm.args.0: --model has a named field (model.path); set it there",
    "env-lowercase-secret": "env.hf_token: a secret in env shows in `docker inspect`; put it in the file secrets.hf_token_file names",
    "env-ray-metrics-port": "env.DASHBOARD_METRIC_PORT: set by vllm-compose for the cluster's slot (its Ray metrics port); remove it",
    "port-octal": "line 8, column 14: 010 is not a plain decimal integer; write it in decimal without leading zeros",
    "port-hex": "line 8, column 14: 0x1F90 is not a plain decimal integer; write it in decimal without leading zeros",
    "port-5000-digits": "line 8, column 14: 999999999999999999999999... is not a plain decimal integer",
    "metrics-retention-too-long": "metrics.retention: 99999999999y: between 1 and 100 years' worth, e.g. 15d",
    "metrics-retention-zero": "metrics.retention: 0d: between 1 and 100 years' worth, e.g. 15d",
    "metrics-listen-other-node": "metrics.listen: 10.0.0.2 is node 'b''s address; Prometheus runs on the head (10.0.0.1)",
    "interface-dotdot": "nodes.0.interface: '..' is not an interface name",
    "roles-all-workers": "nodes.0.role: every node says 'role: worker'; say 'role: head' on the head (or drop the roles: the first node is the head)",
    "args-spelling-tp": "vllm.args.0: -tp has a named field (tensor_parallel_size); set it there",
    "args-spelling-pipeline-parallel-size": "vllm.args.0: --pipeline_parallel_size has a named field (pipeline_parallel_size); set it there",
    "args-spelling-gpu-memory-utilization": "vllm.args.0: --gpu_memory_utilization has a named field (gpu_memory_utilization); set it there",
    "args-spelling-max-model-len": "vllm.args.0: --max_model_len has a named field (max_model_len); set it there",
    "args-spelling-port": "vllm.args.0: --port has a named field (port); set it there",
    "args-spelling-served-model-name": "vllm.args.0: --served_model_name has a named field (served_model_name); set it there",
    "args-spelling-safetensors-load-strategy": "vllm.args.0: --safetensors_load_strategy has a named field (safetensors_load_strategy); set it there",
    "args-spelling-master-addr": "vllm.args.0: --master_addr has a named field (backend: native (derived from the head node)); set it there",
    "args-spelling-node-rank": "vllm.args.0: --node_rank has a named field (backend: native (derived from nodes)); set it there",
    "args-spelling-nnodes": "vllm.args.0: --nnodes has a named field (backend: native (derived from nodes)); set it there",
    "args-spelling-master-port": "vllm.args.0: --master_port has a named field (master_port); set it there",
    "env-secret-github-token": "env.GITHUB_TOKEN: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-wandb-api-key": "env.WANDB_API_KEY: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-ngc-api-key": "env.NGC_API_KEY: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-huggingface-token": "env.HUGGINGFACE_TOKEN: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-my-secret-value": "env.MY_SECRET_VALUE: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-slack-secret": "env.SLACK_SECRET: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-passwd": "env.PASSWD: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "ip-loopback-other": "nodes.1.ip: 127.1.2.3 is a loopback address; use the node's address on the private link",
    "ip-metadata": "nodes.1.ip: 169.254.169.254 is a link-local (169.254.x) address; use the node's address on the private link",
    "ip-multicast-admin": "nodes.1.ip: 239.1.1.1 is a multicast address; use the node's address on the private link",
    "ip-reserved-250": "nodes.1.ip: 250.0.0.1 is a reserved address; use the node's address on the private link",
    "ip-unspecified-head": "nodes.0.ip: 0.0.0.0 is the unspecified address; use the node's address on the private link",
    "port-is-custom-ray-port": "vllm.port: 6380 is taken by ray.port; choose another",
    "port-is-custom-master-port": "vllm.port: 8000 is taken by vllm.master_port; choose another",
    "model-sys-class-x": "model.path: /sys/class/x is a system folder, not a model; give its own folder",
    "model-dev-shm-m": "model.path: /dev/shm/m is a system folder, not a model; give its own folder",
    "model-run-models": "model.path: /run/models is a system folder, not a model; give its own folder",
    "model-boot-x": "model.path: /boot/x is a system folder, not a model; give its own folder",
    "model-bin": "model.path: /bin is a system folder, not a model; give its own folder",
    "model-var": "model.path: /var is a system folder, not a model; give its own folder",
    "model-home": "model.path: /home is a system folder, not a model; give its own folder",
    "model-double-slash-etc": "model.path: //etc is a system folder, not a model; give its own folder",
    "model-other-clusters-secrets": "model.path: /var/lib/vllm-compose/other is a system folder, not a model; give its own folder",
    "model-docker-data": "model.path: /var/lib/docker/x is a system folder, not a model; give its own folder",
    "yaml-merge-key": "line 1, column 7: anchors and aliases (&name, *name) are not supported; write it out",
    "yaml-python-tag": "line 8, column 6: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object:os.system'",
    "yaml-alias-in-list": "line 4, column 4: anchors and aliases (&name, *name) are not supported; write it out",
    "yaml-too-large": "the file is over 1 MiB",
    "env-entrypoint-secrets-dir": "env.VLLM_COMPOSE_SECRETS: the wrapper's entrypoint uses VLLM_COMPOSE_* itself; choose another name",
    "env-entrypoint-base-image": "env.VLLM_COMPOSE_BASE_IMAGE: the wrapper's entrypoint uses VLLM_COMPOSE_* itself; choose another name",
    "image-upper-case-path": "image: 'registry.io/Name/x:1' is not allowed: expected an image reference like registry/name:tag or name@sha256:<digest>",
    "image-space-in-tag": "image: 'vllm/x:a b' is not allowed: expected an image reference like registry/name:tag or name@sha256:<digest>",
    "yaml-complex-key": "line 1, column 3: a key must be a plain value",
    "yaml-deep-nesting": "line 1, column 22: nested deeper than 16 levels",
    "yaml-alias-bomb": "line 1, column 4: anchors and aliases (&name, *name) are not supported; write it out",
    "yaml-anchor-in-config": "line 8, column 6: anchors and aliases (&name, *name) are not supported; write it out",
    "ip-unspecified": "nodes.0.ip: 0.0.0.0 is the unspecified address; use the node's address on the private link",
    "ip-loopback-two-nodes": "nodes.0.ip: 127.0.0.1 is a loopback address; use the node's address on the private link",
    "ip-link-local": "nodes.1.ip: 169.254.1.2 is a link-local (169.254.x) address; use the node's address on the private link",
    "ip-multicast": "nodes.1.ip: 224.0.0.5 is a multicast address; use the node's address on the private link",
    "ip-broadcast": "nodes.1.ip: 255.255.255.255 is the broadcast address; use the node's address on the private link",
    "ip-reserved": "nodes.1.ip: 240.0.0.1 is a reserved address; use the node's address on the private link",
    "port-is-ray-port": "vllm.port: 6379 is taken by ray.port; choose another",
    "port-is-master-port": "vllm.port: 29501 is taken by vllm.master_port; choose another",
    "port-in-ray-worker-ports": "vllm.port: 10202 is taken by Ray's worker ports; choose another",
    "native-ranks-uneven": "vllm.tensor_parallel_size: TP 3 x PP 1 = 3 ranks do not divide over 2 nodes; the native backend runs as many on each node",
    "model-root": "model.path: / is a system folder, not a model; give its own folder",
    "model-etc": "model.path: /etc/models is a system folder, not a model; give its own folder",
    "model-proc": "model.path: /proc/1 is a system folder, not a model; give its own folder",
    "model-usr": "model.path: /usr is a system folder, not a model; give its own folder",
    "env-too-large": "env: 312 KiB of variables; a process cannot start with more than 256 KiB of them here",
    "env-entrypoint-name": "env.VLLM_COMPOSE_WAIT_FOR: the wrapper's entrypoint uses VLLM_COMPOSE_* itself; choose another name",
    "env-secret-openai-key": "env.OPENAI_API_KEY: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-aws": "env.AWS_SECRET_ACCESS_KEY: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-hf-api-token": "env.HF_API_TOKEN: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-secret-password": "env.DB_PASSWORD: a secret in env shows in `docker inspect`; keep it in a file on the nodes (secrets.hf_token_file for Hugging Face), not in the config",
    "env-nul": "env.A: NUL and lone surrogates cannot be in a command line, the environment or a file",
    "args-nul": "vllm.args.0: NUL and lone surrogates cannot be in a command line, the environment or a file",
    "args-underscore-tp": "vllm.args.0: --tensor_parallel_size has a named field (tensor_parallel_size); set it there",
    "args-underscore-backend-equals": "vllm.args.0: --distributed_executor_backend has a named field (backend (top level)); set it there",
    "args-secret-underscore": "vllm.args.0: a secret on the command line shows in `ps` and `docker inspect`; use secrets.api_key_file / secrets.hf_token_file",
    "args-secret-hf-token-equals": "vllm.args.0: a secret on the command line shows in `ps` and `docker inspect`; use secrets.api_key_file / secrets.hf_token_file",
    "image-upper-case-repository": "image: 'Vllm/vllm-openai:v0.32.0' is not allowed: expected an image reference like registry/name:tag or name@sha256:<digest>",
    "secret-in-env": "env.VLLM_API_KEY: a secret in env shows in `docker inspect`; put it in the "
    "file secrets.api_key_file names",
    "secret-on-command-line": "vllm.args.0: a secret on the command line shows in `ps` and "
    "`docker inspect`; use secrets.api_key_file / secrets.hf_token_file",
    "secret-ray-token-in-env": "env.RAY_AUTH_TOKEN: a secret in env shows in `docker inspect`; "
    "put it in the file secrets.ray_token_file names",
    "ray-auth-off-by-env": "env.RAY_AUTH_MODE: set by vllm-compose from ray.token_auth; set that "
    "instead",
    "dup-contexts": "nodes.1.context: a is already used by node 'a'",
    "dup-heads": "nodes.1.role: a second head; only one node may say 'role: head'",
    "dup-ips": "nodes.1.ip: 10.0.0.1 is already used by node 'a'",
    "dup-node-names": "nodes.1.name: a is already used by node 'a'",
    "huge-args": "vllm.args: List should have at most 256 items after validation, not 300",
    "huge-env-value": "env.X: String should have at most 8192 characters",
    "huge-name": "name: 'ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "huge-nodes": "nodes: List should have at most 64 items after validation, not 100",
    "inject-args-named-flag": "vllm.args.0: --tensor-parallel-size has a named field (tensor_parallel_size); set it there",
    "inject-context-shell": "nodes.1.context: '$(reboot)' is not allowed: must match ^[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$",
    "inject-env-key-equals": "env.A=B.[key]: 'A=B' is not allowed: a variable name has letters, digits and '_', not starting with a digit",
    "inject-env-key-space": "env.A B.[key]: 'A B' is not allowed: a variable name has letters, digits and '_', not starting with a digit",
    "inject-env-per-node": "env.NCCL_SOCKET_IFNAME: set per node by vllm-compose from nodes[].ip / interface; remove it here",
    "vllm-config-root-with-ray": "env.VLLM_CONFIG_ROOT: set by vllm-compose (backend ray): it holds the list that keeps per-node variables on their node; remove it here",
    "inject-image-newline": "image: 'vllm\\nprivileged: true' is not allowed: expected an image reference like registry/name:tag or name@sha256:<digest>",
    "inject-image-space": "image: 'vllm openai' is not allowed: expected an image reference like registry/name:tag or name@sha256:<digest>",
    "inject-interface-shell": "interface: 'eth0; reboot' is not allowed: an interface name has 1-15 letters, digits, '_', '.', ':' or '-'",
    "inject-model-colon": "model.path: '/models/m:/etc' is not allowed: expected an absolute path without ':' or control characters",
    "inject-model-newline": "model.path: '/models/m\\n  privileged: true' is not allowed: expected an absolute path without ':' or control characters",
    "inject-model-relative": "model.path: 'models/m' is not allowed: expected an absolute path without ':' or control characters",
    "inject-model-traversal": "model.path: '/models/../etc' has '.' or '..' in it; write the plain absolute path",
    "inject-name-compose-interpolation": "name: '${HOME}' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "inject-name-newline": "name: 'c\\nservices: {}' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "inject-name-shell": "name: 'c; rm -rf /' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "inject-node-interpolation": "nodes.0.name: '${USER}' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "inject-node-slash": "nodes.0.name: 'a/b' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "inject-node-traversal": "nodes.0.name: '../etc' is not allowed: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    "parallel-pp-too-big": "vllm.tensor_parallel_size: TP 1 x PP 3 = 3 GPUs asked for, the nodes have 2",
    "parallel-tp-too-big": "vllm.tensor_parallel_size: TP 4 x PP 1 = 4 GPUs asked for, the nodes have 2",
    "syntax-duplicate-key": "line 8, column 1: duplicate key 'name'",
    "syntax-duplicate-key-in-node": "line 5, column 29: duplicate key 'ip'",
    "syntax-empty-file": "the file must hold a mapping (name: ..., nodes: ...)",
    "syntax-tab-indent": "line 3, column 1: found character '\\t' that cannot start any token",
    "syntax-top-level-list": "the file must hold a mapping (name: ..., nodes: ...)",
    "syntax-unclosed-flow": "line 2, column 1: expected the node content, but found '<stream end>'",
    "type-accelerator-unknown": "accelerator: Input should be 'nvidia' or 'none'",
    "type-args-number": "vllm.args.1: expected a string, got 8; quote it in the YAML",
    "type-args-string": "vllm.args: Input should be a valid list",
    "type-backend-unknown": "backend: Input should be 'ray' or 'native'",
    "type-env-number": "env.NCCL_DEBUG: expected a string, got 3; quote it in the YAML",
    "type-gpus-string": "nodes.0.gpus: Input should be a valid integer",
    "type-gpus-zero": "nodes.0.gpus: Input should be greater than or equal to 1",
    "type-ip-invalid": "nodes.1.ip: Input is not a valid IPv4 address",
    "type-ip-number": "nodes.1.ip: expected an address like 192.168.200.12, got 167772162",
    "type-nodes-empty": "nodes: List should have at least 1 item after validation, not 0",
    "type-nodes-mapping": "nodes: Input should be a valid list",
    "type-port-huge": "vllm.port: Input should be less than or equal to 65535",
    "type-port-string": "vllm.port: Input should be a valid integer",
    "type-port-too-big": "vllm.port: Input should be less than or equal to 65535",
    "type-startup-timeout-low": "vllm.startup_timeout: Input should be greater than or equal to 10",
    "type-utilization-above-one": "vllm.gpu_memory_utilization: Input should be less than or equal to 1",
    "unknown-node-key": "nodes.1.ipp: unknown key (known: name, ip, context, interface, gpus, role)",
    "unknown-top-level": "nodez: unknown key (known: name, image, backend, profile, accelerator, interface, nodes, replicas, model, vllm, ray, group, canary, gpu_temperature_limit, env, front_door, metrics, secrets)",
    "unknown-vllm-key": "vllm.tp: unknown key (known: port, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization, max_model_len, served_model_name, safetensors_load_strategy, master_port, startup_timeout, args)",
}


def test_the_corpus_is_large_and_every_case_has_its_expected_line() -> None:
    assert len(CASES) >= 120
    assert set(CASES) == set(FIRST)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broken_config_is_refused_naming_the_field_and_nothing_changes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(CASES[name])
    # What the user already has: a rendered stack of their own and a lock. Neither may change.
    (tmp_path / "compose/c/a").mkdir(parents=True)
    (tmp_path / "compose/c/a/compose.yaml").write_text("# the user's own\n")
    (tmp_path / "cluster.lock.json").write_text("{}\n")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["vllm-compose", "render", "cluster.yaml"])
    with pytest.raises(SystemExit) as exited:
        commands.main()
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "cluster.yaml is invalid:"
    assert lines[1] == f"  {FIRST[name]}"
    assert all(line.startswith("  ") and len(line) < 400 for line in lines[1:])
    assert tree(tmp_path) == before


@pytest.fixture(scope="module")
def probe_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A config whose vLLM args and environment hold the hostile values, for an image whose
    `vllm` prints what it was given, rendered and its key written onto this engine: a node's
    folder as a user of the plain compose files has it."""
    docker = DockerClient()
    base = images.debian_base(docker)
    probe = "vllm-compose-test/argv-probe:1"
    tmp_path = tmp_path_factory.mktemp("probe")
    context = tmp_path / "probe"
    context.mkdir()
    (context / "vllm").write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items()"
        " if k.startswith('V') and k[1:].isdigit()}}))\n"
    )
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY vllm /usr/local/bin/vllm\nRUN chmod +x /usr/local/bin/vllm\n"
    )
    docker.legacy_build(context, tags=[probe])
    model = tmp_path / "model"
    model.mkdir()
    config = tmp_path / "probe.yaml"
    config.write_text(
        f"name: probe\nimage: {probe}\nbackend: native\naccelerator: none\ninterface: lo\n"
        "nodes: [{name: local, ip: 127.0.0.1, context: default}]\n"
        f"model: {{path: {model}}}\n"
        f"vllm: {{args: {json.dumps(HOSTILE)}}}\n"
        f"env: {json.dumps({f'V{i}': v for i, v in enumerate(HOSTILE)})}\n"
        "front_door: {enabled: false}\n"  # serve alone: it binds nothing on this machine
    )
    rendered = cli("render", config, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    pushed = cli("secrets", config, cwd=tmp_path)  # by hand, the key goes first
    assert pushed.returncode == 0, pushed.stderr
    yield tmp_path / "compose/probe/local"
    shutil.rmtree("/var/lib/vllm-compose/probe", ignore_errors=True)


# pytest-docker brings the probe's stack up (`docker compose up`, as by hand) for this module
# (pyproject: --container-scope=module) and down with its volumes after it.
@pytest.fixture(scope="module")
def docker_compose_file(probe_folder: Path) -> str:
    return str(probe_folder / "compose.yaml")


@pytest.fixture(scope="module")
def docker_compose_project_name() -> str:
    return "probe"


@pytest.fixture(scope="module")
def docker_setup() -> list[str]:
    return ["up --detach --pull never serve"]  # not --wait: the probe never turns healthy


@pytest.mark.engine
def test_values_that_look_dangerous_reach_the_container_exactly(
    docker_services: Services, docker_compose_file: str
) -> None:
    """Through the rendered stack and Compose to a running container: argv and environment hold
    each string as written; nothing was interpolated, executed or injected."""
    stack = DockerClient(compose_files=[docker_compose_file], compose_project_name="probe")
    printed: list[str] = []

    def printed_json() -> bool:  # the probe prints and exits; its supervisor starts it again
        log = str(stack.compose.logs(["serve"], no_log_prefix=True))
        printed[:] = [line for line in log.splitlines() if line.startswith("{")]
        return bool(printed)

    docker_services.wait_until_responsive(check=printed_json, timeout=60, pause=0.5)
    seen = json.loads(printed[0])
    assert seen["argv"][-len(HOSTILE) :] == HOSTILE
    assert [seen["env"][f"V{i}"] for i in range(len(HOSTILE))] == HOSTILE
