#!/usr/bin/env bash
# A second, short GPU call for a session that already ran benchmarks/gpu_session.sh: the new
# node-level code on the real machine, in ~4 minutes (wheels carried in .whl/, as gpu_session.sh).
#   1. `gpucluster health-check --nvml-only --hw h200-sxm` (Slurm's HealthCheckProgram mode): what it
#      read and its verdict, and how long it took (it must finish well inside Slurm's 60 s);
#   2. the quick tier (gpu_session.sh's `quick` step: readiness, fail-closed per node and GPU, the
#      per-node probe and set-aside stage, all on the real H200);
#   3. a dry run under a site profile with readiness thresholds (h200-spectrumx): the preflight's
#      readiness lines for this node.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
GPU_SESSION_STEPS="${GPU_SESSION_STEPS-quick}" GPU_SESSION_BUDGET_S=${FOLLOWUP_QUICK_BUDGET_S:-200} bash benchmarks/gpu_session.sh
export PYTHONPATH="$REPO:/tmp/site"
cli() { python3 -c 'import sys; from pytest_gpucluster.cli import main; sys.exit(main())' "$@"; }
start=$(date +%s%N)
timeout 60 bash -c "$(declare -f cli); cli health-check --nvml-only --hw h200-sxm" >"$OUT/nvml_only.txt" 2>&1
echo "exit $? after $((($(date +%s%N) - start) / 1000000)) ms" >>"$OUT/nvml_only.txt"
timeout 90 python3 -m pytest -p no:cacheprovider acceptance/ --hw=h200-spectrumx --gpucluster-dry-run -m quick \
  --results-dir /tmp/followup-dry >"$OUT/dry_run_spectrumx.txt" 2>&1
echo "exit $?" >>"$OUT/dry_run_spectrumx.txt"
echo "== nvml-only"; cat "$OUT/nvml_only.txt"
echo "== dry run (h200-spectrumx), readiness lines"; grep -i -E "readiness|peermem|acs|fabric manager|memlock|iommu|remap|persistence|SIGN-OFF|tests:" "$OUT/dry_run_spectrumx.txt" | head -40
