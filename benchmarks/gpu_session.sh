#!/usr/bin/env bash
# One prepared command for a session that is lent a GPU machine (the `device` tool's `run`).
#
#   bash benchmarks/gpu_session.sh            # every step, within GPU_SESSION_BUDGET_S (540 s)
#   GPU_SESSION_STEPS="numerics" bash benchmarks/gpu_session.sh    # a rerun of one step
#
# 1. installs the wheels carried in .whl/ (benchmarks/gpu_session_wheels.sh builds them here)
#    into /tmp/site, as the device README says, and says in one line which imports are missing;
# 2. records the machine once (nvidia-smi -q, topo -m, the versions) to $OUT/session.txt;
# 3. runs, each under its own timeout and each logged to $OUT/<step>.log:
#      numerics  pytest acceptance/test_numerics.py --hw=auto        (issue 29's must-show)
#      quick     pytest acceptance/ --hw=auto -m quick (numerics already ran: not again)
#      standard  pytest acceptance/ --hw=auto -m "standard and not quick", only where time remains
#      sft       benchmarks/sft_overhead.py in its GPU shape (4-layer Llama-2-7B, 1 GPU)
#      busbw     benchmarks/busbw_fidelity.py --nccl-tests, only with nccl-tests and 2+ GPUs
# 4. tars the results directories small into $OUT/results.tar.gz and writes every figure into
#    $OUT/summary.txt (benchmarks/gpu_summary.py): the one file the session has to read.
#
# What comes back from $OUT is at most 8 files: session.txt, numerics.log, quick.log,
# standard.log, sft.log, busbw.log (only when it ran), results.tar.gz, summary.txt.
#
# Without nvidia-smi (this development VM) the same steps run on --hw=cpu-local, in their CPU
# shape, and every file says so; where $OUT is unset the files go to a new temporary folder.
# Nothing here reaches the network. Environment knobs (all optional):
#   GPU_SESSION_BUDGET_S  the whole run's seconds (default 540: with 1-2 min of machine start it
#                         leaves ~4 of the 15 device minutes for one targeted rerun)
#   GPU_SESSION_STEPS     which steps, space-separated (default: numerics quick standard sft busbw;
#                         empty: none, the machine facts and the summary only)
#   GPU_SESSION_HW        the profile for the pytest steps (default auto; cpu-local without a GPU)
#   NCCL_TESTS_DIR        where nccl-tests binaries are, if not on PATH
#   PYTHON                the interpreter (default python3, the one holding torch on the device)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
BUDGET_S=${GPU_SESSION_BUDGET_S:-540}
STEPS=${GPU_SESSION_STEPS-numerics quick standard sft busbw}
SITE=${GPU_SESSION_SITE:-/tmp/site}
SUMMARY_RESERVE_S=20
T0=$(date +%s)
export PYTHONUNBUFFERED=1

if [[ -z "${OUT:-}" ]]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session-out.XXXXXX")
  echo "gpu_session: OUT is unset (not on the device machine): the files go to $OUT"
fi
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session-work.XXXXXX")
SESSION="$OUT/session.txt"
STEPS_TSV="$WORK/steps.tsv"
: >"$STEPS_TSV"

say() { printf '%s [%4s s] %s\n' "$(date -u +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" | tee -a "$SESSION"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
wanted() { [[ " $STEPS " == *" $1 "* ]]; }
min() { if (($1 < $2)); then echo "$1"; else echo "$2"; fi; }
skip_step() {
  printf '%s\t-\t-\t-\t%s\n' "$1" "$2" >>"$STEPS_TSV"
  say "step $1: not run: $2"
}
# run_step NAME LIMIT_S COMMAND...: the command's output to $OUT/NAME.log, SIGTERM at the limit
# (pytest then stops like Ctrl-C and keeps results.json), SIGKILL 20 s later.
run_step() {
  local name=$1 limit=$2 started rc
  shift 2
  say "step $name: up to $limit s: $*"
  started=$(date +%s)
  set +e
  timeout --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  set -e
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$rc" "$(($(date +%s) - started))" "$limit" >>"$STEPS_TSV"
  say "step $name: exit $rc after $(($(date +%s) - started)) s; last line: $(tail -n 1 "$OUT/$name.log" | cut -c1-200)"
}

say "gpu_session: repo $REPO, OUT $OUT, work $WORK, budget $BUDGET_S s, steps: $STEPS"

# ---- 1. wheels: the packages the device image lacks (gpu_session_wheels.sh), then the imports
SITE_PATH=""
if compgen -G ".whl/*.whl" >/dev/null; then
  if "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
      say "wheels: installed $(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l) from .whl/ into $SITE"
      SITE_PATH=":$SITE"
    else
      say "wheels: pip install from .whl/ FAILED (above); going on with what $PY has"
    fi
  else
    say "wheels: .whl/ holds wheels for Python 3.12 (the device image's); $PY is $("$PY" -V 2>&1): not installed"
  fi
else
  say "wheels: none carried (.whl/ is empty or absent): $PY's own packages only"
fi
# The checkout first: its code is what runs (the wheel of the project only brings the pytest11
# entry point); then the carried packages, ahead of the image's.
export PYTHONPATH="$REPO$SITE_PATH${PYTHONPATH:+:$PYTHONPATH}"

# ---- 2. the machine, once
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && timeout 30 nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
fi
{
  echo "== date: $(date -u)"
  echo "== uname: $(uname -a)"
  echo "== cpus: $(nproc); memory:"
  free -g || true
  if ((HAVE_GPU)); then
    echo "== nvidia-smi"
    timeout 30 nvidia-smi || echo "(nvidia-smi failed: $?)"
    echo "== nvidia-smi topo -m"
    timeout 30 nvidia-smi topo -m || echo "(nvidia-smi topo -m failed: $?)"
    echo "== nvidia-smi -q"
    timeout 60 nvidia-smi -q || echo "(nvidia-smi -q failed: $?)"
  else
    echo "== nvidia-smi: absent or failing: no NVIDIA GPU; every step runs its CPU fallback"
  fi
} >>"$SESSION" 2>&1
if ((HAVE_GPU)); then
  timeout 30 nvidia-smi --format=csv,noheader \
    --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,power.limit \
    >"$WORK/smi.csv" 2>&1 || true
  HW=${GPU_SESSION_HW:-auto}
  GPUS=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  say "machine: $(head -n 1 "$WORK/smi.csv"); $GPUS GPU(s); profile --hw=$HW"
else
  HW=${GPU_SESSION_HW:-cpu-local}
  GPUS=0
  say "machine: NO GPU (nvidia-smi absent): CPU fallback, every step on --hw=$HW and in its CPU shape"
fi

set +e
timeout 180 "$PY" benchmarks/gpu_facts.py --json "$WORK/facts.json" 2>&1 | grep -v '^\[.*\] \[WARNING\]' | tee -a "$SESSION"
facts_rc=${PIPESTATUS[0]}
set -e
PLUGIN_ARGS=()
if [[ -f "$WORK/facts.json" ]] && ! "$PY" -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1]))["plugin_entry_point"])' "$WORK/facts.json"; then
  PLUGIN_ARGS=(-p pytest_gpucluster.plugin)
fi
if ((facts_rc != 0)); then
  say "imports: a package every step needs is missing (exit $facts_rc): no step can run"
  STEPS=""
fi

# ---- 3. the steps, most wanted first; the later ones keep their reserve
SFT_RESERVE_S=0
if wanted sft; then SFT_RESERVE_S=120; fi
PYTEST=("$PY" -m pytest "${PLUGIN_ARGS[@]}" -p no:cacheprovider -rfEs --hw="$HW")

if wanted numerics; then
  limit=$(min 180 $(($(left) - SFT_RESERVE_S - SUMMARY_RESERVE_S)))
  if ((limit >= 60)); then
    run_step numerics "$limit" "${PYTEST[@]}" acceptance/test_numerics.py --results-dir "$WORK/numerics"
  else
    skip_step numerics "no time left ($(left) s of the budget)"
  fi
fi

if wanted quick; then
  limit=$(min 330 $(($(left) - SFT_RESERVE_S - SUMMARY_RESERVE_S)))
  if ((limit >= 60)); then
    ignore=()
    if wanted numerics; then ignore=(--ignore=acceptance/test_numerics.py); fi
    run_step quick "$limit" "${PYTEST[@]}" acceptance/ -m quick "${ignore[@]}" --results-dir "$WORK/quick"
  else
    skip_step quick "no time left ($(left) s of the budget)"
  fi
fi

if wanted standard; then
  limit=$(min 300 $(($(left) - SFT_RESERVE_S - SUMMARY_RESERVE_S)))
  if ((limit >= 90)); then
    run_step standard "$limit" "${PYTEST[@]}" acceptance/ -m "standard and not quick" --results-dir "$WORK/standard"
  else
    skip_step standard "no time left: $(left) s of the budget, $SFT_RESERVE_S s kept for sft"
  fi
fi

if wanted sft; then
  limit=$(min 200 $(($(left) - SUMMARY_RESERVE_S)))
  if ((limit < 60)); then
    skip_step sft "no time left ($(left) s of the budget)"
  elif ((HAVE_GPU)); then
    # The GPU shape of the benchmark's docstring (Llama-2-7B cut to 4 layers, micro-batch 8 x
    # 2,048 tokens, bf16 ZeRO-2, SDPA, 1 GPU; the case of h200-spectrumx, whose 989 TFLOP/s dense
    # peak is the H100 SXM's too), in 2 paired rounds without a warm-up round: a GPU step's time
    # excludes start-up, and 4 jobs fit the limit where 14 would not.
    run_step sft "$limit" "$PY" benchmarks/sft_overhead.py --hw h200-spectrumx --case llama2-7b-2node \
      --layers 4 --grad-accum 1 --attn-implementation sdpa --nproc 1 --rank-sched none \
      --steps 10 --warmup 2 --warmup-rounds 0 --min-rounds 2 --max-rounds 2 --max-seconds 100
  else
    run_step sft "$limit" "$PY" benchmarks/sft_overhead.py --hw cpu-local --rank-sched none \
      --steps 5 --warmup 1 --warmup-rounds 0 --min-rounds 1 --max-rounds 1 --max-seconds 60
  fi
fi

if wanted busbw; then
  nccl_tests=""
  for dir in "${NCCL_TESTS_DIR:-}" "$(dirname "$(command -v all_reduce_perf 2>/dev/null || echo /nonexistent/x)")" \
    /usr/local/nccl-tests/build /opt/nccl-tests/build /workspace/nccl-tests/build; do
    if [[ -n "$dir" && -x "$dir/all_reduce_perf" ]]; then
      nccl_tests=$dir
      break
    fi
  done
  if [[ -z "$nccl_tests" ]]; then
    skip_step busbw "no nccl-tests binaries (all_reduce_perf not on PATH, nor in NCCL_TESTS_DIR or the usual build folders)"
  elif ((GPUS < 2)); then
    skip_step busbw "nccl-tests in $nccl_tests, but $GPUS GPU(s): a 1-rank collective moves no bus traffic"
  else
    limit=$(($(left) - SUMMARY_RESERVE_S))
    if ((limit >= 60)); then
      run_step busbw "$limit" "$PY" benchmarks/busbw_fidelity.py --nccl-tests "$nccl_tests" \
        --min-rounds 2 --max-rounds 2 --max-seconds $((limit - 30))
    else
      skip_step busbw "no time left ($(left) s of the budget)"
    fi
  fi
fi

# ---- 4. results, small, and the summary
dirs=()
for name in numerics quick standard; do
  if [[ -d "$WORK/$name" ]]; then dirs+=("$name"); fi
done
if ((${#dirs[@]})); then
  # plots and the HTML report are re-made from results.json (gpucluster report); logs stay
  tar -C "$WORK" --exclude='*.png' --exclude='report.html' --exclude='.*.lock' -czf "$OUT/results.tar.gz" "${dirs[@]}"
  size=$(stat -c %s "$OUT/results.tar.gz")
  if ((size > 15 * 1024 * 1024)); then
    tar -C "$WORK" --exclude='*.png' --exclude='report.html' --exclude='.*.lock' --exclude='*.log' \
      -czf "$OUT/results.tar.gz" "${dirs[@]}"
    say "results: $size bytes with the rank logs, over the 16 MiB a file may bring back: tarred without them"
  fi
  say "results: $OUT/results.tar.gz ($(stat -c %s "$OUT/results.tar.gz") bytes: ${dirs[*]})"
fi
summary_args=(--out "$OUT/summary.txt" --facts "$WORK/facts.json" --steps "$STEPS_TSV")
if [[ -s "$WORK/smi.csv" ]]; then summary_args+=(--smi "$WORK/smi.csv"); fi
for name in numerics quick standard; do
  if [[ -d "$WORK/$name" ]]; then summary_args+=(--results "$name=$WORK/$name"); fi
done
if [[ -f "$OUT/sft.log" ]]; then summary_args+=(--sft-log "$OUT/sft.log"); fi
if [[ -f "$OUT/busbw.log" ]]; then summary_args+=(--busbw-log "$OUT/busbw.log"); fi
if ! "$PY" benchmarks/gpu_summary.py "${summary_args[@]}"; then
  say "summary: gpu_summary.py FAILED (above); the step logs and results.tar.gz hold the figures"
fi
say "done in $(($(date +%s) - T0)) s: read $OUT/summary.txt; files: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
