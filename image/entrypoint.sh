#!/bin/sh
# vllm-compose entrypoint: checks the base image has what the command needs, then execs it.
# A missing tool is one clear line naming the image, instead of "ray: not found" minutes later.
set -eu
image="${VLLM_COMPOSE_BASE_IMAGE:-this image}"

need() {
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "vllm-compose: $image has no '$1' on PATH; $2" >&2
    exit 127
}

case "${1:-}" in
    ray) need ray "use an image with Ray, or set 'backend: native' in the config" ;;
    vllm) need vllm "set 'image' in the config to an image with vLLM" ;;
    "") echo "vllm-compose: no command given; the rendered compose.yaml sets one" >&2; exit 2 ;;
esac

# Ray's token (backend ray) where Ray looks by default, so every process here finds it, those
# started by `docker exec` too (health checks, which begin while the wait below runs), and no
# variable in the configured env names it.
if [ -r /run/secrets/ray_token ]; then
    mkdir -p "${HOME:-/root}/.ray"
    ln -sf /run/secrets/ray_token "${HOME:-/root}/.ray/auth_token"
fi
if [ -r /run/secrets/hf_token ]; then
    HF_TOKEN_PATH=/run/secrets/hf_token
    export HF_TOKEN_PATH
fi
# A Ray worker that starts before its head would give up after a few retries: wait for the
# head's GCS port first, bounded, so the nodes of a hand-run stack can start in any order. (In a
# group, the supervisor waits for it before every start of the command.)
in_group="${VLLM_COMPOSE_GROUP_LISTEN:-}${VLLM_COMPOSE_GROUP_ROOT:-}"
if [ "${VLLM_COMPOSE_WAIT_FOR:-}" != "" ] && [ "$in_group" = "" ]; then
    seconds="${VLLM_COMPOSE_WAIT_SECONDS:-300}"
    echo "vllm-compose: waiting up to $seconds s for the head's Ray at $VLLM_COMPOSE_WAIT_FOR" >&2
    vllm-compose-health wait-for "$VLLM_COMPOSE_WAIT_FOR" --seconds "$seconds"
fi
# The API key arrives as a file (Compose secret), never in argv or the container's configured env:
# vLLM reads VLLM_API_KEY from the environment of this process only. Behind the front door vLLM
# listens on loopback and takes no key: the door checks every client's.
if [ -r /run/secrets/api_key ] && [ -z "${VLLM_COMPOSE_FRONT_DOOR:-}" ]; then
    VLLM_API_KEY="$(cat /run/secrets/api_key)"
    export VLLM_API_KEY
fi
# In a group (every rendered stack), the command runs in step with the other nodes: started
# once its root and members are up, and again whenever one of them restarts (group.py).
if [ "$in_group" != "" ]; then
    exec vllm-compose-health supervise -- "$@"
fi
exec "$@"
