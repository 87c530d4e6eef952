#!/usr/bin/env bash
# The GPU checks in one run: the CUDA unit tests, then the three speed targets that need a GPU
# (FOL vs a per-sample loop, fol_fuzz batched vs one seed at a time, corruptions vs imagecorruptions),
# then the zoo's training throughput (forward + backward, batch 64, native sizes; fp32 and bf16 autocast).
# Usage (repository root, robustest and its test/bench extras installed with a CUDA build of torch):
#     DATA_DIR=../shared/data OUT=/tmp/gpu bash benchmarks/gpu_checks.sh
# Logs and JSON go to $OUT; about 5 minutes on one GPU, plus the AutoAttack comparison (bench_eval.py).
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
