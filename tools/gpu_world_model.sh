#!/usr/bin/env bash
# One short session on a lent GPU machine: does more compute close the T's yaw gap (issue 4)?
# Two world-model trainings side by side on the push_t data, each sized to the time left:
#   scratch: the 2-hour recipe's dynamics (config/models/push_t_curriculum.yaml: plain stage 2, then
#            stage 4 on deep self-forcing chains, 59 / 41 of the time as on the CPU) over models/push_t_2h's
#            autoencoder, at batch $BATCH instead of 16;
#   gen7:    the shipped default models/push_t fine-tuned by stage 4 alone at batch $BATCH.
# Evaluated back on the CPU machine (`iws eval openloop --episodes 47`, `iws eval longrun`).
# Run once on an H100 (2026-12-05): neither run moved the yaw (docs/architecture.md, self-forcing; step
# rates in docs/benchmarks.md). This network leaves the GPU mostly idle: a longer session should buy
# more steps, not larger batches.
#
# Prepared on the CPU machine (.gpu/ is git-ignored through .git/info/exclude):
#   python3 tools/dataset_xz.py pack data/push_t_dataset .gpu/push_t_dataset --jobs 2   # 3.3 GB -> about 20 MB
# Run with carry [".gpu"]. Results go to $OUT: session.log and one tar per run (weights, config, logs).
# A dry run here: DEVICE=cpu BATCH=4 BUDGET_S=200 PROBE_STEPS=3 DATA_PACK=<a small packed dataset> bash tools/gpu_world_model.sh
set -u
BUDGET_S=${BUDGET_S:-540}          # everything below ends by then (the call's limit is a little more)
BATCH=${BATCH:-192}                # 256 fails on CUDA: the temporal attention's batch is B x 16 x 16 latent pixels, > 65535
DEVICE=${DEVICE:-cuda}
PROBE_STEPS=${PROBE_STEPS:-30}
SIDE_BY_SIDE=${SIDE_BY_SIDE:-2.0}  # slow-down of each training with the other beside it (H100, 2026-12-05: about 1.9)
DATA_PACK=${DATA_PACK:-.gpu/push_t_dataset}
T0=$SECONDS
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(ls -d src/*/ | tr '\n' ':')
iws() { python3 -m iws_bringup.cli "$@"; }
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"

DATA=/tmp/push_t_dataset
python3 tools/dataset_xz.py unpack "$DATA_PACK" $DATA || exit 1
echo "unpacked at $((SECONDS - T0)) s"

# 1. Step time of each objective at this batch, alone (random latents of the real windows' shapes).
probe=$(python3 - "$DEVICE" "$BATCH" "$PROBE_STEPS" $DATA <<'EOF'
import sys, time, torch
from iws_data.dataset import Dataset
from iws_world_model.config import load_config
from iws_world_model.networks import WorldModelNetwork, normalize_latent
from iws_world_model.objectives import StageObjective
from iws_world_model.train import WindowData, batches, normalization_from
device, batch, steps, data = torch.device(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model_cfg, train_cfg = load_config("config/models/push_t_curriculum.yaml")
dataset = Dataset(data)
network = WorldModelNetwork(model_cfg, len(dataset.joint_names)).to(device)
latents = normalize_latent(torch.randn(len(dataset), model_cfg.latent_channels, model_cfg.latent_size, model_cfg.latent_size))
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
rates = []
for stage in (2, 4):
    trains, cfg = train_cfg.for_stage(stage)
    objective = StageObjective(network, trains, cfg, normalization_from(dataset)).to(device)
    optimizer = torch.optim.AdamW(objective.trainable_parameters(), lr=1e-5)
    stream = batches(WindowData(dataset, StageObjective.window_length(model_cfg, cfg), "train", latents), batch, 0, 0, 1, 0, device)
    for i in range(steps + 5):
        if i == 5:
            sync(); began = time.time()
        loss = objective(next(stream))["loss"]
        optimizer.zero_grad(); loss.backward(); optimizer.step()
    sync(); rates.append((time.time() - began) / steps)
print(*rates)
EOF
) || exit 1
read -r S2 S4 <<< "$probe"
left=$((BUDGET_S - (SECONDS - T0) - 75))   # 75 s: each run's mask pass, encoding and final save, the tars
read -r SCRATCH2 SCRATCH4 GEN7 <<< $(python3 -c "
s2, s4, f, left = $S2, $S4, $SIDE_BY_SIDE, $left
n = lambda seconds, rate: max(50, int(seconds / (rate * f)) // 50 * 50)
print(n(0.59 * left, s2), n(0.41 * left, s4), n(left, s4))")
echo "probe at batch $BATCH: stage 2 $S2 s/step, stage 4 $S4 s/step alone; $left s left ->" \
     "scratch $SCRATCH2 + $SCRATCH4 steps, gen7 $GEN7 stage-4 steps"

# 2. Both trainings side by side; `timeout` is the backstop (SIGTERM saves the step reached).
python3 - $SCRATCH2 $SCRATCH4 <<'EOF'
import sys, yaml
text = yaml.safe_load(open("config/models/push_t_curriculum.yaml"))
text["train"]["stage2"]["steps"], text["train"]["stage4"]["steps"] = int(sys.argv[1]), int(sys.argv[2])
yaml.safe_dump(text, open("/tmp/push_t_curriculum_gpu.yaml", "w"), sort_keys=False)
EOF
limit=$((BUDGET_S - (SECONDS - T0) - 15))
timeout $limit python3 -m iws_world_model.train --config /tmp/push_t_curriculum_gpu.yaml --data $DATA \
    --out /tmp/runs/scratch --stage 2,4 --init-autoencoder models/push_t_2h --batch-size $BATCH \
    --device $DEVICE --threads 4 > /tmp/runs_scratch.log 2>&1 & scratch=$!
timeout $limit python3 -m iws_world_model.train --config config/models/push_t_curriculum.yaml --data $DATA \
    --out /tmp/runs/gen7 --stage 4 --init-weights models/push_t --steps $GEN7 --batch-size $BATCH \
    --device $DEVICE --threads 4 > /tmp/runs_gen7.log 2>&1 & gen7=$!
wait $scratch; echo "scratch exited $? at $((SECONDS - T0)) s"
wait $gen7; echo "gen7 exited $? at $((SECONDS - T0)) s"

for name in scratch gen7; do
  tail -c 600 /tmp/runs_$name.log | tr '\r' '\n' | tail -4
  cp /tmp/runs_$name.log /tmp/runs/$name/train.log 2>/dev/null
  tar -cf "$OUT/$name.tar" -C /tmp/runs "$name/model.safetensors" "$name/config.json" "$name/start_windows.npz" \
      "$name/train.log" "$name/tb"
done
ls -la "$OUT"
echo "done at $((SECONDS - T0)) s"
