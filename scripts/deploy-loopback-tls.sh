#!/usr/bin/env bash
# A real deployment on one machine: a SuperLink with TLS and SuperNode authentication, NODES authenticated
# SuperNodes (one per "institution"), and a small run (one expert per node: 1 DDPM, the rest FM) submitted with
# `flwr run`; every process it started is stopped by its PID at the end. See scripts/deploy_loopback.py.
# Usage: scripts/deploy-loopback-tls.sh [NODES] [PORT] [more options of deploy_loopback.py]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nodes=${1:-2}
port=${2:-0}  # 0: the first free block of ports in 19400..19499
shift $(( $# < 2 ? $# : 2 ))
python=${PYTHON:-$(command -v python3)}
[ -x "$(dirname "$(command -v flwr 2>/dev/null || echo /)")/python" ] && python=${PYTHON:-$(dirname "$(command -v flwr)")/python}
exec "$python" "$here/deploy_loopback.py" --nodes "$nodes" --port "$port" "$@"
