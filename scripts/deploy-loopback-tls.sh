#!/usr/bin/env bash
# A real deployment on one machine: a SuperLink with TLS and SuperNode authentication, two authenticated
# SuperNodes (one per "institution"), and a small run (one expert per node: 1 DDPM, the rest FM) submitted with
# `flwr run`. Everything lives in a temporary directory; the processes it started are stopped at the end.
# Usage: scripts/deploy-loopback-tls.sh [NODES] [PORT]
set -euo pipefail
nodes=${1:-2}
port=${2:-19291}
app=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export FLWR_HOME=$work/flwr FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; pkill -f "flower-superexec.*$port" 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$FLWR_HOME" && cd "$work"

# certificates: a CA, and a server certificate whose SAN matches the address the nodes use
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=hddm-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" > san.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
    -extfile san.ext 2>/dev/null
cat > "$FLWR_HOME/config.toml" <<EOT
[superlink]
default = "loopback-tls"
[superlink.loopback-tls]
address = "127.0.0.1:$port"
root-certificates = "$work/ca.crt"
EOT

flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile server.key \
    --enable-supernode-auth --host 127.0.0.1 --port "$port" --disable-runtime-dependency-installation \
    > superlink.log 2>&1 & pids+=($!)
sleep 6
for k in $(seq 0 $((nodes - 1))); do  # each institution makes a key pair and sends only the public key
    ssh-keygen -q -t ecdsa -b 384 -N "" -f "node-$k" -C "node-$k"
    flwr supernode register "node-$k.pub" loopback-tls --name "institution-$k" | tail -n 1
    flower-supernode --root-certificates ca.crt --auth-supernode-private-key "node-$k" \
        --superlink "127.0.0.1:$port" --port $((port + 3 + k)) \
        --node-config "expert-id=$k num-threads=1 cache-dir=\"$work/cache\"" > "supernode-$k.log" 2>&1 & pids+=($!)
done
sleep 6
cd "$app"
flwr run . loopback-tls --stream --run-config "run-dir=\"$work/run\" cache-dir=\"$work/cache\" overrides=\"num_experts=$nodes objectives={ddpm: 1, fm: $((nodes - 1)), ddpm_clusters: [0]} expert.steps=30 router.steps=30 sampling.num_steps=10 sampling.samples_per_prompt=2 federation.min_nodes=$nodes federation.min_experts=$nodes\""
status=$(flwr ls loopback-tls --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])')
echo "run status: $status; run directory: $work/run"
[ "$status" = "finished:completed" ] && [ -f "$work/run/report.json" ]
