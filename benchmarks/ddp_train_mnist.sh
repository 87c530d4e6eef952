#!/bin/bash
# DDP training against one process: LeNet-5 on all of MNIST, 2 epochs, seeds 0 and 1 (docs/BENCHMARKS.md,
# "Does DDP training under torchrun match one process?"). DATA_DIR: the MNIST folder (default ../shared/data);
# OUT: where the runs go.
set -e
cd "$(dirname "$0")/.."
data=${DATA_DIR:-../shared/data}
out=${OUT:-/tmp/ddp-mnist}
for s in 0 1; do
  /usr/bin/time -f "one process, seed $s: %e s" robustest train --dataset mnist --data-dir "$data" --model lenet5 \
    --epochs 2 --seed "$s" --threads 1 --no-progress --out "$out/one$s"
  /usr/bin/time -f "2 ranks, seed $s: %e s" torchrun --nproc-per-node 2 -m robustest train --dataset mnist \
    --data-dir "$data" --model lenet5 --epochs 2 --seed "$s" --threads 1 --no-progress --out "$out/two$s"
done
