# The vllm-compose wrapper image: any vLLM image plus the entrypoint and health checks that the
# rendered compose stacks call. Build: make image (BASE_IMAGE=...).
ARG BASE_IMAGE=hellohal2064/vllm-qwen3.5-gb10:latest
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="vllm-compose wrapper" \
      org.opencontainers.image.description="vLLM image with vllm-compose entrypoint and health checks" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.version="${VERSION}" \
      io.vllm-compose.wrapper="1"
ENV VLLM_COMPOSE_BASE_IMAGE="${BASE_IMAGE}"
COPY image/entrypoint.sh /usr/local/bin/vllm-compose-entrypoint
# The health tool: its command, and the modules it imports from the folder it names. No RUN: a
# build step needs a network, and hosts with Docker's bridge turned off have none.
COPY image/health.py /usr/local/bin/vllm-compose-health
COPY image/answers.py image/canary.py image/facts.py image/gpus.py image/group.py image/raychecks.py image/stopping.py image/transfer.py /usr/local/lib/vllm-compose/
ENTRYPOINT ["/usr/local/bin/vllm-compose-entrypoint"]
