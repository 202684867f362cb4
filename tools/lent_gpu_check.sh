#!/bin/sh
# `make gpu-check` on a lent GPU machine that reaches no package registry (the device tool's
# nvidia-h100-x1 / nvidia-h200: torch 2.11.0+cu130 and Python 3.12 in their image). Before it, the
# calls that carry `.gpu/partNN` (made here by `python -m tools.cuda_carry --out .gpu
# --with-quantgate`, which prints the calls) have appended the parts, in order, to /tmp/carry.tar;
# this call appends the last one and carries .gpu/unpack.sh (it checks the bundle's sha256 first)
# and .gpu/cache (gpu-check's power figures, simulated here: about 50 s on 2 cores, which
# `validate` there then reads; their key is the rules' source, not the box).
# Usage there: `sh tools/lent_gpu_check.sh [RUN_LIMIT_S]`. The run is stopped after RUN_LIMIT_S
# (default 450) so that what it measured still comes back within the call: the runs, reports and
# MLflow store under /tmp/gpu-check as $OUT/gpu-check.tgz (the device returns files two folders
# deep), whatever the exit. Run again on the same machine, it resumes (stored stages reused).
set -e
WORK=/tmp/gpu-check
START=$(date +%s)
stamp() { echo "[gpu-check +$(( $(date +%s) - START )) s] $*"; }
save() { [ -z "$OUT" ] || tar -C "$WORK" -czf "$OUT/gpu-check.tgz" . 2>/dev/null || true; }
mkdir -p "$WORK"
trap save EXIT
[ -d /tmp/site/vllm ] || { stamp "unpack"; sh .gpu/unpack.sh; }
export PYTHONPATH=/tmp/site:$PWD CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 QG_RESULTS_DIR=$WORK/runs QG_REPORTS_DIR=$WORK/reports \
    MLFLOW_TRACKING_URI=sqlite:///$WORK/mlflow.db
[ ! -d .gpu/cache ] || export XDG_CACHE_HOME=$PWD/.gpu/cache
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
stamp "models (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})"
python3 -m infra.demo_models --models-dir models --baseline-only
stamp "validate"
python3 -m flows.cli validate flows/specs/gpu-check.yaml
stamp "run"
status=0
timeout -s INT -k 30 "${1:-450}" python3 -m flows.cli run flows/specs/gpu-check.yaml || status=$?
stamp "gate (run exit $status)"
python3 -m flows.cli gate "$(ls -d "$WORK"/runs/smollm2-135m-gpu-check-* | tail -1)" || true
nvidia-smi --query-gpu=memory.used --format=csv
stamp "done"
exit $([ "$status" -le 1 ] && echo 0 || echo "$status")
