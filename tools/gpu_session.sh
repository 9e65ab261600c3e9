#!/usr/bin/env bash
# One short session on a lent GPU machine (no ROS there, Python 3.12 with CUDA torch):
#   1. `iws bench step` on the GPU: the default model and the paper's 128x128 config, batch 1 and
#      parallel worlds;
#   2. the two Diffusion Policies of experiments a and b (100 reference-robot demos, 100 world-model
#      demos) trained side by side for as many steps as the remaining time allows, from demonstration
#      files that `iws policy train --save-demos` wrote on the CPU machine (latents, not images).
# Results go to $OUT (at most 8 files of 16 MiB): bench.jsonl, train logs, and per policy two tars of
# checkpoints (the final one and snapshots at 1/4, 1/2, 3/4 of the steps).
#
# Prepared on the CPU machine (.gpu/ is git-ignored through .git/info/exclude):
#   iws policy train --data data/demos_real140_dataset --episodes 100 --successful-only \
#       --image-encoder models/push_t --save-demos .gpu/real100.npz --steps 1 --out /tmp/probe_real100
#   (the same for data/demos_wm7_250_dataset -> .gpu/wm100.npz), then xz -k .gpu/*.npz, and the
#   diffusers wheel in .gpu/whl (pip download --no-deps --python-version 3.12 ... diffusers==0.42.1).
# Run with carry [".gpu/real100.npz.xz", ".gpu/wm100.npz.xz", ".gpu/whl"].
set -u
BUDGET_S=${BUDGET_S:-450}          # everything below ends by then (the call's limit is a little more)
BATCH=${BATCH:-256}
DEVICE=${DEVICE:-cuda}             # DEVICE=cpu BATCH=8 PROBE_STEPS=10 BENCH_STEPS=0 BUDGET_S=150: a dry run here
PROBE_STEPS=${PROBE_STEPS:-300}
BENCH_STEPS=${BENCH_STEPS:-300}   # 0: no benchmarks
T0=$SECONDS
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
LOG=$OUT/session.log                # $OUT takes 8 files: this log, bench.jsonl and four tars
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src/iws_common:src/iws_data:src/iws_world_model:src/iws_policy:src/iws_bringup
iws() { python3 -m iws_bringup.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"

unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 22)" "$@"; }
(unxz .gpu/real100.npz.xz /tmp/real100.npz && unxz .gpu/wm100.npz.xz /tmp/wm100.npz) &
unpack=$!

# 1. Step speed on the GPU (nothing else on it yet).
bench() {
  [ "$BENCH_STEPS" -gt 0 ] || return 0
  echo "{\"args\": \"$*\", \"result\": $(iws bench step --device $DEVICE --json --steps $BENCH_STEPS "$@" || echo null)}" >> "$OUT/bench.jsonl"
}
bench --model models/push_t
bench --model models/push_t --fused-attention
bench --model models/push_t --batch 64
bench --model config/models/paper_128.yaml
bench --model config/models/paper_128.yaml --batch 16
echo "bench done at $((SECONDS - T0)) s"; cat "$OUT/bench.jsonl" 2>/dev/null
wait $unpack || exit 1

# 2. Probe the step rate of both trainings running together, then size the real runs to the time left.
train() {  # name steps extra...
  local name=$1 steps=$2; shift 2
  python3 -m iws_bringup.cli policy train --data /tmp/$name.npz --image-encoder models/push_t --out /tmp/runs/$name \
      --steps "$steps" --batch "$BATCH" --device "$DEVICE" --threads 4 --save-every 2000 "$@"
}
train real100 $PROBE_STEPS > /tmp/probe_real100.json 2>/tmp/probe_real100.log & probe=$!
train wm100 $PROBE_STEPS > /tmp/probe_wm100.json 2>/tmp/probe_wm100.log; wait $probe  # (a bare wait would wait for tee too)
tail -c 300 /tmp/probe_wm100.log; cat /tmp/probe_*.json
rate=$(python3 -c "import json; print(max(json.load(open(f'/tmp/probe_{n}.json'))['seconds'] for n in ['real100', 'wm100']) / $PROBE_STEPS)")
left=$((BUDGET_S - (SECONDS - T0) - 40))
steps=$(python3 -c "s = int($left / ($rate * 1.08)); print(max(400, s - s % 400))")
echo "probe: $rate s/step with two trainings side by side; $left s left -> $steps steps at batch $BATCH"
rm -rf /tmp/runs
pids=()
for name in real100 wm100; do
  timeout $((BUDGET_S - (SECONDS - T0) - 10)) bash -c "$(declare -f train); BATCH=$BATCH DEVICE=$DEVICE train $name $steps --snapshot-every $((steps / 4))" \
      > /tmp/train_$name.json 2> /tmp/train_$name.log & pids+=($!)
done
wait "${pids[@]}"
echo "training done at $((SECONDS - T0)) s"
for name in real100 wm100; do
  r=/tmp/runs/$name
  tail -c 400 /tmp/train_$name.log | tr '\r' '\n' | tail -2; echo; cat /tmp/train_$name.json
  snaps=($(ls -d $r/step_* 2>/dev/null | sort))
  tar -cf "$OUT/${name}_a.tar" -C /tmp/runs "$name/config.json" "$name/model.safetensors" \
      $(for s in "${snaps[@]:0:1}"; do echo "$name/$(basename $s)"; done)
  tar -cf "$OUT/${name}_b.tar" -C /tmp/runs $(for s in "${snaps[@]:1:2}"; do echo "$name/$(basename $s)"; done)
done
ls -la "$OUT"
