#!/bin/sh
# `make gpu-check` on a lent GPU machine that reaches no package registry (the device tool's
# nvidia-h200: torch 2.11.0+cu130 and Python 3.12 in its image). Before it, the calls that carry
# `.gpu/partNN` (made here by `python -m tools.cuda_carry --out .gpu --with-quantgate`) have
# appended the parts, in order, to /tmp/carry.tar; this call carries .gpu/unpack.sh too.
# Usage there: `sh tools/lent_gpu_check.sh`; the runs, reports and MLflow store under
# /tmp/gpu-check come back as $OUT/gpu-check.tgz (the device returns files two folders deep).
set -e
WORK=/tmp/gpu-check
[ -d /tmp/site/vllm ] || sh .gpu/unpack.sh
export PYTHONPATH=/tmp/site:$PWD CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 QG_RESULTS_DIR=$WORK/runs QG_REPORTS_DIR=$WORK/reports \
    MLFLOW_TRACKING_URI=sqlite:///$WORK/mlflow.db
mkdir -p "$WORK"
python3 -m infra.fp8_checkpoint models
python3 -m flows.cli validate flows/specs/gpu-check.yaml
status=0
python3 -m flows.cli run flows/specs/gpu-check.yaml || status=$?
python3 -m flows.cli gate "$(ls -d "$WORK"/runs/smollm2-135m-gpu-check-* | tail -1)" || true
[ -z "$OUT" ] || tar -C "$WORK" -czf "$OUT/gpu-check.tgz" .
exit $([ "$status" -le 1 ] && echo 0 || echo "$status")
