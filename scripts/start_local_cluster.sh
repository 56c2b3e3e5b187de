#!/usr/bin/env bash
# A multi-node Ray cluster on this one machine, to try cluster mode: a head node plus N worker
# nodes, each advertising logical GPUs (no real GPU needed; use the stand-in runner to try
# scheduling: +testing.runner=kvsweep.testing.stand_ins:sleep_cell). Stop it with: ray stop
#   NODES=2 GPUS_PER_NODE=2 scripts/start_local_cluster.sh
#   python -m kvsweep ray.address=127.0.0.1:6379 +testing.runner=kvsweep.testing.stand_ins:sleep_cell +testing.sleep_s=2
set -euo pipefail
NODES=${NODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-2}
CPUS_PER_NODE=${CPUS_PER_NODE:-2}
PORT=${PORT:-6379}
# RAY_worker_niceness=0: cells measure at normal priority (Ray's default is nice 15).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0 RAY_worker_niceness=0
ray start --head --port "$PORT" --num-cpus "$CPUS_PER_NODE" --num-gpus "$GPUS_PER_NODE" \
  --include-dashboard=false --object-store-memory 100000000 --resources '{"accelerator_type:SIM": 1}'
for i in $(seq 2 "$NODES"); do
  ray start --address "127.0.0.1:$PORT" --num-cpus "$CPUS_PER_NODE" --num-gpus "$GPUS_PER_NODE" \
    --object-store-memory 100000000 --resources '{"accelerator_type:SIM": 1}'
done
ray status
echo "cluster address: 127.0.0.1:$PORT"
