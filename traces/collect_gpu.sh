#!/usr/bin/env bash
# Collect the GPU traces of traces/README.md ("Measured on a GPU") on a machine with one CUDA GPU, and check one-rank
# training against simfog: every zoo model's trace (with the one-GPU overlap stand-in), then `simfog validate
# --backend nccl --loopback --mode model` of ResNet-50 and GPT-2 on one GPU. Usage, from the repository root:
#   bash traces/collect_gpu.sh OUT_DIR RUN_LABEL
# Writes OUT_DIR/NAME-gpu-bB-RUN_LABEL.json.gz, OUT_DIR/validate-*.csv and OUT_DIR/log-RUN_LABEL.txt.
set -uo pipefail
out=${1:?output folder}; label=${2:?run label}
mkdir -p "$out"
log="$out/log-$label.txt"
py=${PYTHON:-python3}
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  lscpu | grep -E '^(Model name|CPU\(s\)):'
} >>"$log" 2>&1
for spec in resnet50:32 vgg16:16 densenet121:16 bert-base:8 gpt2:8 resnet20:32 mlp:1024; do
  name=${spec%%:*}; b=${spec##*:}
  echo "== collect $name b$b $(date -u +%T)" >>"$log"
  timeout 150 "$py" -m simfog collect model "$name" --device cuda --batch-size "$b" --iterations 30 --warmup 10 \
    --overlap -o "$out/$name-gpu-b$b-$label.json.gz" >>"$log" 2>&1 || echo "FAILED rc=$? $name" >>"$log"
done
for spec in resnet50:32:resnet50-h200-b32 gpt2:8:gpt2-h200-b8; do
  IFS=: read -r name b trace <<<"$spec"
  exp=$(mktemp --suffix=.toml)
  printf 'seed = 1\niterations = 10\n[workload]\ntrace = "%s"\ncompute = "samples"\n[cluster]\nnodes = 1\ngpus_per_node = 1\nnic_bandwidth = "100Gbit/s"\n[comm]\nmerge = "ddp"\n' \
    "$PWD/traces/$trace.json.gz" >"$exp"
  echo "== validate $name $(date -u +%T)" >>"$log"
  timeout 150 "$py" -m simfog validate "$exp" --loopback --backend nccl --mode model \
    --csv "$out/validate-$name-$label.csv" >>"$log" 2>&1 || echo "FAILED rc=$? validate $name" >>"$log"
done
date -u +%FT%TZ >>"$log"
