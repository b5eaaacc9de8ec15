#!/usr/bin/env bash
# The GPU measurements in one run, for a machine with a CUDA GPU and about 16 cores (about 9 minutes):
#   1. bench_sps.py, connect four, ACTORS actors, the learner on CUDA: learner-consumed SPS against what the
#      actors produce unthrottled (same run), the queue against the high-water mark, the learner's time
#      in updates and waiting for batches; at B = 32 and at B = 128;
#   2. run.py compare --study algos with the conv network: IMPALA's and A3C's throughput side by side.
# Everything goes to OUT (default /tmp/on_gpu) and to standard output.
#
#   bash bench/on_gpu.sh [OUT]
#   DEVICE=cpu ACTORS=2 SECONDS_MEASURED=10 MINUTES=0.3 bash bench/on_gpu.sh   # a quick try without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/on_gpu}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ACTORS=${ACTORS:-14}
SECONDS_MEASURED=${SECONDS_MEASURED:-60}
MINUTES=${MINUTES:-2}
mkdir -p "$OUT"
"$PY" -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), os.cpu_count(), 'cores')"
for B in 32 128; do
  "$PY" bench/bench_sps.py --config configs/connect_four.yaml --seconds "$SECONDS_MEASURED" --warmup 20 \
    --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" --set learner.batch_size="$B" \
    | tee "$OUT/bench_sps_B$B.txt"
done
"$PY" run.py compare --study algos --config configs/connect_four.yaml --minutes "$MINUTES" --seeds 0 \
  --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" --out "$OUT/algos" | tee "$OUT/compare.txt"
