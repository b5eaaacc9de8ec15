#!/usr/bin/env bash
# The GPU measurements in one run, for a machine with a CUDA GPU and about 16 cores (about 10 minutes):
#   1. bench_ingest.py: the learner's ingest against a bare XREADGROUP + XACK loop, with its thread and
#      with WORKERS ingest worker processes, and each process's CPU per batch;
#   2. bench_sps.py, connect four, ACTORS actors, the learner on CUDA: learner-consumed SPS against what the
#      actors produce unthrottled (same run), the queue against the high-water mark, the learner's time
#      in updates and waiting for batches; at B = 32 with the ingest thread, then with WORKERS ingest
#      workers at B = 32 and B = 128;
#   3. run.py compare --study algos with the conv network: IMPALA's and A3C's throughput side by side;
#   4. bench_core.py: the update with and without the LSTM core on CUDA (cuDNN's LSTM), and the core's
#      unroll as nn.LSTM calls per run of steps against a step-by-step loop;
#   5. bench_pixels.py: the learner's update on Pong's frames (configs/atari_pong.yaml, T x B = 20 x 4, the
#      config's, and 20 x 32) with IMPALA's deep (resnet) and shallow torsos on CUDA, agent steps/s;
#   6. bench_sps.py on configs/atari_pong.yaml, ACTORS actors, the learner on CUDA at B = 32, with the
#      resnet torso and then the shallow one: learner-consumed SPS against the actors' unthrottled rate;
#   7. boxing (not in the default set): configs/atari_boxing_league.yaml trained for BOXING_MINUTES
#      (default 7) with ACTORS actors and the learner on CUDA at B = 32, then its greedy final policy
#      against `random` (evaluation.json: wins, draws, losses per seat); the run in OUT/runs.
#   8. pongleague (not in the default set): configs/atari_pong_league.yaml trained for PONG_MINUTES
#      (default 8) the same way, then its greedy final policy and three earlier snapshots against ALE's
#      built-in player as first_0 (evaluation.json's built_in_player and over_training), the player it
#      never trained against; on 2 cores its hour of 4.0M agent steps scored -19.5 there.
#   9. pongreplay (not in the default set): bench_sps.py on configs/atari_pong.yaml pinned to 2 cores
#      (taskset -c 0,1: the reference machine's cores) with the learner on CUDA, as configured, with
#      learner.replay_fraction=0.5 and with learner.batch_size=8: whether replay's or a larger batch's extra
#      updates still take the actors' cores once the update runs on a GPU (on 2 CPU cores replay 0.5 halved
#      the agent steps trained, docs/atari.md).
#  10. c4wide (not in the default set): bench_sps.py on configs/connect_four_league.yaml pinned to 2 cores with
#      the learner on CUDA, as configured and with a twice-as-wide network (agent.channels 128, agent.hidden
#      512): on 2 CPU cores the wide one trains half the agent steps/s and so no fewer blunders in 13.5 minutes,
#      though fewer at equal agent steps (docs/league.md); whether a GPU learner removes that cost.
# STEPS chooses the parts (default all but boxing and pongleague: "ingest sps algos core pixels pong");
# about 14 minutes in all, "pixels pong" about 7, "boxing" about BOXING_MINUTES + 3, "pongleague" about
# PONG_MINUTES + 4, "pongreplay" about 4, "c4wide" about 3. Everything goes to OUT (default
# /tmp/on_gpu) and to standard output. The Atari parts need ale-py, multi-agent-ale-py, opencv-python-headless
# and zstandard among the machine's wheels (requirements.txt pins them).
#
#   bash bench/on_gpu.sh [OUT]
#   STEPS="pixels pong" bash bench/on_gpu.sh          # the Atari parts only
#   STEPS=boxing BOXING_MINUTES=7 bash bench/on_gpu.sh # the Boxing league with 14 actors, then against random
#   STEPS=pongleague PONG_MINUTES=8 bash bench/on_gpu.sh  # two-player Pong's league, then the built-in player
#   STEPS=pongreplay bash bench/on_gpu.sh             # Pong on 2 cores and a GPU: replay and a larger batch
#   STEPS=c4wide bash bench/on_gpu.sh                 # connect four on 2 cores and a GPU: the wide network
#   DEVICE=cpu ACTORS=2 WORKERS=1 SECONDS_MEASURED=10 MINUTES=0.3 bash bench/on_gpu.sh   # a quick try without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/on_gpu}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ACTORS=${ACTORS:-14}
WORKERS=${WORKERS:-4}
SECONDS_MEASURED=${SECONDS_MEASURED:-45}
MINUTES=${MINUTES:-2}
BOXING_MINUTES=${BOXING_MINUTES:-7}
PONG_MINUTES=${PONG_MINUTES:-8}
STEPS=${STEPS:-ingest sps algos core pixels pong}
want() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p "$OUT"
"$PY" -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), os.cpu_count(), 'cores')"
want ingest && for W in 0 "$WORKERS"; do
  "$PY" bench/bench_ingest.py --unrolls 16000 --rounds 2 --set learner.ingest_workers="$W" \
    --set learner.prefetch_batches=$((2 * W + 2)) | tee "$OUT/bench_ingest_W$W.txt"
done
want sps && for run in "32 thread" "32 workers" "128 workers"; do
  set -- $run
  # Workers: two slots each, and a high-water mark (default 256) with room for every slot read in part.
  mark=$((2 * WORKERS * $1 > 256 ? 2 * WORKERS * $1 : 256))
  ingest=()
  [ "$2" = workers ] && ingest=(--set learner.ingest_workers="$WORKERS" --set learner.prefetch_batches=$((2 * WORKERS))
                                --set actor.high_water_mark="$mark")
  "$PY" bench/bench_sps.py --config configs/connect_four.yaml --seconds "$SECONDS_MEASURED" --warmup 20 \
    --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" --set learner.batch_size="$1" \
    "${ingest[@]}" | tee "$OUT/bench_sps_B$1_$2.txt"
done
want algos && "$PY" run.py compare --study algos --config configs/connect_four.yaml --minutes "$MINUTES" --seeds 0 \
  --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" --out "$OUT/algos" | tee "$OUT/compare.txt"
if want core; then
  "$PY" bench/bench_core.py --device "$DEVICE" --B 32 | tee "$OUT/bench_core_B32.txt"
  "$PY" bench/bench_core.py --device "$DEVICE" --B 128 | tee "$OUT/bench_core_B128.txt"
fi
want pixels && for B in 4 32; do
  "$PY" bench/bench_pixels.py --device "$DEVICE" --torsos resnet shallow --skip-wire --reps 10 \
    --set learner.batch_size="$B" | tee "$OUT/bench_pixels_B$B.txt"
done
want pong && for torso in resnet shallow; do
  "$PY" bench/bench_sps.py --config configs/atari_pong.yaml --seconds "$SECONDS_MEASURED" --warmup 20 \
    --set agent.torso="$torso" --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" \
    --set learner.batch_size=32 --set learner.num_threads=1 --set actor.high_water_mark=256 \
    | tee "$OUT/bench_sps_pong_$torso.txt"
done
want boxing && "$PY" run.py train --config configs/atari_boxing_league.yaml --set run.dir="$OUT/runs" \
  --set run.max_minutes="$BOXING_MINUTES" --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" \
  --set learner.batch_size=32 --set learner.num_threads=1 --set actor.high_water_mark=256 \
  --eval-history 0 2>&1 | tee "$OUT/boxing.txt"
want pongleague && "$PY" run.py train --config configs/atari_pong_league.yaml --set run.dir="$OUT/runs" \
  --set run.max_minutes="$PONG_MINUTES" --set actor.num_actors="$ACTORS" --set learner.device="$DEVICE" \
  --set learner.batch_size=32 --set learner.num_threads=1 --set actor.high_water_mark=256 \
  --eval-games 10 --eval-history 3 2>&1 | tee "$OUT/pongleague.txt"
want pongreplay && for setting in "learner.replay_fraction=0" "learner.replay_fraction=0.5" "learner.batch_size=8"; do
  taskset -c 0,1 "$PY" bench/bench_sps.py --config configs/atari_pong.yaml --seconds "$SECONDS_MEASURED" --warmup 20 \
    --set learner.device="$DEVICE" --set "$setting" | tee "$OUT/bench_sps_pong_2cores_${setting//[.=]/_}.txt"
done
want c4wide && for width in "64 256" "128 512"; do
  set -- $width
  taskset -c 0,1 "$PY" bench/bench_sps.py --config configs/connect_four_league.yaml --seconds "$SECONDS_MEASURED" \
    --warmup 20 --set learner.device="$DEVICE" --set agent.channels="$1" --set agent.hidden="$2" \
    | tee "$OUT/bench_sps_c4_2cores_channels$1.txt"
done
true
