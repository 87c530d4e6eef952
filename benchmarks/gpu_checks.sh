#!/usr/bin/env bash
# The GPU checks in one run: the CUDA unit tests, then the three speed targets that need a GPU
# (FOL vs a per-sample loop, fol_fuzz batched vs one seed at a time, corruptions vs imagecorruptions),
# then the zoo's training throughput (forward + backward, batch 64, native sizes; fp32 and bf16 autocast),
# then the reduced full-setting runs: each seed setting's real architecture and per-step settings on synthetic
# data of its shape (a few hundred training steps, PGD steps and forward passes; about a minute each), whose
# measured rates give the full settings' run times (docs/REPRODUCING.md), and each setting's --dry-run on CUDA.
# Usage (repository root, robustest and its test/bench extras installed with a CUDA build of torch):
#     DATA_DIR=../shared/data OUT=/tmp/gpu bash benchmarks/gpu_checks.sh
# Then the hot-path switches (docs/SCALING.md): score --amp bf16, eval's clean pass in bf16, channels_last off/on
# (inference and input gradients of wrn; training throughput of resnet20 and wrn) and the --batch-size auto probe.
# Logs and JSON go to $OUT; about 17 minutes on one GPU.
set -uo pipefail
DATA_DIR="${DATA_DIR:-../shared/data}"
OUT="${OUT:-/tmp/robustest-gpu}"
# bench_eval attacks an MNIST LeNet-5: $CHECKPOINT, trained here (3 epochs) when absent
CHECKPOINT="${CHECKPOINT:-$OUT/lenet5/model.pt}"
mkdir -p "$OUT"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))" \
    | tee "$OUT/device.txt" || exit 1
python -m pytest -q -k cuda tests 2>&1 | tail -15 | tee "$OUT/pytest_cuda.txt"
python benchmarks/bench_metrics.py --data-dir "$DATA_DIR" --device cuda --repeats 3 --loop-subset 1000 \
    --no-coverage > "$OUT/bench_metrics_cuda.txt" 2>&1
tail -20 "$OUT/bench_metrics_cuda.txt"
python benchmarks/bench_fuzzing.py --data-dir "$DATA_DIR" --device cuda --seeds 1000 --single-seeds 50 \
    --coverage-iterations 0 --json "$OUT/bench_fuzzing_cuda.json" > "$OUT/bench_fuzzing_cuda.txt" 2>&1
tail -10 "$OUT/bench_fuzzing_cuda.txt"
python benchmarks/bench_corruptions.py --device cuda --n 1000 --size 32 --severity 3 --repeats 3 \
    --json "$OUT/bench_corruptions_cuda.json" > "$OUT/bench_corruptions_cuda.txt" 2>/dev/null
tail -26 "$OUT/bench_corruptions_cuda.txt"
python benchmarks/bench_zoo.py --device cuda --batch 64 --steps 5 --warmup 2 \
    --json "$OUT/bench_zoo_cuda.json" > "$OUT/bench_zoo_cuda.txt" 2>&1
tail -20 "$OUT/bench_zoo_cuda.txt"
python benchmarks/bench_zoo.py --device cuda --batch 64 --steps 5 --warmup 2 --amp \
    --json "$OUT/bench_zoo_cuda_amp.json" > "$OUT/bench_zoo_cuda_amp.txt" 2>&1
tail -20 "$OUT/bench_zoo_cuda_amp.txt"
[ -f "$CHECKPOINT" ] || python -m robustest train --dataset mnist --data-dir "$DATA_DIR" --model lenet5 --epochs 3 \
    --device cuda --out "$(dirname "$CHECKPOINT")" --no-progress > "$OUT/train_lenet5.txt" 2>&1
python benchmarks/bench_eval.py --checkpoint "$CHECKPOINT" --data-dir "$DATA_DIR" --device cuda --n 1000 \
    --linf 0.1 0.3 --l2 2.0 --paper > "$OUT/bench_eval_cuda.txt" 2>&1
tail -40 "$OUT/bench_eval_cuda.txt"
for setting in robot-cifar10-resnet20 weakrobust-cifar10-wrn40-2 weakrobust-imagenet100-resnet50; do
    python benchmarks/bench_settings.py --setting "$setting" --device cuda --amp bf16 --steps 300 \
        --json "$OUT/bench_settings_$setting.json" > "$OUT/bench_settings_$setting.txt" 2>&1
    tail -1 "$OUT/bench_settings_$setting.txt"
done
python benchmarks/reproduce_robot.py --setting cifar10-resnet20 --dry-run --device cuda --out "$OUT/dry_robot" \
    > "$OUT/dry_robot.txt" 2>&1; echo "robot cifar10-resnet20 dry run on cuda: exit $?"
for setting in cifar10-wrn40-2 imagenet100-resnet50; do
    python benchmarks/reproduce_weakrobust.py --setting "$setting" --dry-run --device cuda --out "$OUT/dry_$setting" \
        > "$OUT/dry_$setting.txt" 2>&1; echo "weak-robust $setting dry run on cuda: exit $?"
done
# analyze on CUDA: float32 against --amp bf16 (20,000 MNIST training images, Q = 20), and the same under
# torchrun on one GPU (nccl, a single rank: the process-group path on CUDA; several GPUs need a bigger machine)
for amp in "" "--amp bf16"; do
    /usr/bin/time -f "analyze cuda ${amp:-fp32}: %e s wall" python -m robustest analyze --checkpoint "$CHECKPOINT" \
        --dataset mnist --data-dir "$DATA_DIR" --split train --limit 20000 --neighbors 20 --device cuda $amp \
        --quiet --out "$OUT/analyze_cuda${amp:+_bf16}" 2>&1 | tail -1
done
torchrun --nproc-per-node 1 -m robustest analyze --checkpoint "$CHECKPOINT" --dataset mnist --data-dir "$DATA_DIR" \
    --split train --limit 20000 --neighbors 20 --device cuda --quiet --out "$OUT/analyze_cuda_torchrun" \
    > "$OUT/analyze_cuda_torchrun.txt" 2>&1; echo "analyze under torchrun (nccl, 1 rank): exit $?"
# hot-path switches: score (gini) and eval's clean pass in float32 against bf16 autocast (compute time from
# results.json: score_s, clean_s), on the 10,000 MNIST test images
for amp in "" "--amp bf16"; do
    tag="${amp:+_bf16}"
    python -m robustest score --checkpoint "$CHECKPOINT" --dataset mnist --data-dir "$DATA_DIR" --metric gini \
        --batch-size 1024 --device cuda $amp --quiet --out "$OUT/score_gini$tag" > "$OUT/score_gini$tag.txt" 2>&1
    python -m robustest eval --checkpoint "$CHECKPOINT" --dataset mnist --data-dir "$DATA_DIR" --eps 0.1 \
        --version custom --attacks fgsm --batch-size 1024 --device cuda $amp --quiet --out "$OUT/eval_clean$tag" \
        > "$OUT/eval_clean$tag.txt" 2>&1
    python - "$OUT" "$tag" "$([ -n "$amp" ] && echo bf16 || echo fp32)" <<'PY'
import json, sys
out, tag, name = sys.argv[1:]
try:
    s = json.load(open(f"{out}/score_gini{tag}/results.json"))
    e = json.load(open(f"{out}/eval_clean{tag}/results.json"))
    print(f"{name}: score gini {s['timings']['score_s']:.2f} s (mean {s['mean']:.4f}); eval clean pass "
          f"{e['timings']['clean_s']:.2f} s (clean accuracy {e['clean_accuracy']:.4f})")
except (OSError, KeyError, ValueError) as exc:
    print(f"{name}: score/eval did not finish ({exc}); see {out}/score_gini{tag}.txt, eval_clean{tag}.txt")
PY
done
# channels_last off against auto (on, on CUDA) for a conv net of the zoo, and the probe's batch sizes
python benchmarks/bench_gpu_switches.py --device cuda --model wrn --batch 256 --steps 10 --warmup 3 \
    --json "$OUT/bench_gpu_switches.json" > "$OUT/bench_gpu_switches.txt" 2>&1
tail -6 "$OUT/bench_gpu_switches.txt"
for cl in off auto; do
    ROBUSTEST_CHANNELS_LAST=$cl python benchmarks/bench_zoo.py --device cuda --models resnet20,wrn --batch 128 \
        --steps 5 --warmup 2 --json "$OUT/bench_zoo_channels_last_$cl.json" > "$OUT/bench_zoo_channels_last_$cl.txt" 2>&1
    echo "training throughput, channels_last $cl:"; tail -3 "$OUT/bench_zoo_channels_last_$cl.txt"
done
# --batch-size auto on a real verb: the size score --metric fol (input gradients) and analyze picked
python -m robustest score --checkpoint "$CHECKPOINT" --dataset mnist --data-dir "$DATA_DIR" --metric fol \
    --batch-size auto --device cuda --quiet --out "$OUT/score_fol_auto" > "$OUT/score_fol_auto.txt" 2>&1
python -m robustest analyze --checkpoint "$CHECKPOINT" --dataset mnist --data-dir "$DATA_DIR" --split train \
    --limit 20000 --neighbors 20 --batch-size auto --device cuda --quiet --out "$OUT/analyze_auto" \
    > "$OUT/analyze_auto.txt" 2>&1
for run in score_fol_auto analyze_auto; do
    python -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], 'batch size', \
d['settings']['batch_size'], 'total', round(d['timings']['total_s'], 2), 's')" "$OUT/$run/results.json" "$run" \
        || echo "$run did not finish: see $OUT/$run.txt"
done
# certified bounds on the GPU (docs/CERTIFY.md has no CUDA figure yet): IBP and CROWN over 1,000 MNIST test images
for method in ibp crown; do
    /usr/bin/time -f "certify $method cuda: %e s wall" python -m robustest certify --checkpoint "$CHECKPOINT" \
        --dataset mnist --data-dir "$DATA_DIR" --eps 0.1 --method "$method" --limit 1000 --device cuda --quiet \
        --out "$OUT/certify_$method" > "$OUT/certify_$method.txt" 2>&1 || echo "certify $method failed: see $OUT"
done
