#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU and CuPy, run the `gpu` tests, calibrate the GPU
# backend (--quick: hardware probes, then the sim.serving.opcost op tables -- GEMMs and
# attention -- timed with CuPy, then the engine's own terms fitted on CuPy engine iterations)
# and validate that profile on held-out workloads with all three checks of `pdsim validate`:
# the scheduling model (engine runs replayed on their own iteration times), the cost model
# (the profile's price of each engine iteration) and end to end (with the machine's speed
# checked between engine runs). Everything goes under OUTDIR.
#
#   hwbench/gpu_check.sh OUTDIR              (run from the repository root, venv active)
#   hwbench/gpu_check.sh --dry-run OUTDIR    (print the steps and their time limits, check
#                                             that the commands exist and the limits fit the
#                                             budget; runs nothing, needs no GPU)
#
# Budget: 8 minutes in all (BUDGET_S); each step has its own limit and the limits add up to
# less. Outputs:
#   OUTDIR/pytest_gpu.txt        the gpu tests' output      (+ pytest_gpu.rc)
#   OUTDIR/profile-gpu.json      the measured GPU profile   (+ calibrate.txt, calibrate.rc)
#   OUTDIR/ops.txt               the op tables' sources and sizes (from the profile)
#   OUTDIR/validate.txt          pdsim validate's three tables (+ validate.json, validate.rc,
#                                validate/validate_cdf.png, validate/scenarios/)
#   OUTDIR/summary.txt           one line per step: name, exit status, seconds
# Exit status: 1 when a step failed (calibrate exits 1 when it rejects an impossible fit or an
# unsteady machine, validate when a check is over its limit), else 3 when validate was
# inconclusive (the machine's speed moved more than its limit), else 0.
set -u
DRY=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY=1
    shift
fi
OUT="${1:?usage: hwbench/gpu_check.sh [--dry-run] OUTDIR}"
BUDGET_S=480
# three held-out workloads (resident, streaming at a cache fraction calibration never saw,
# the 67 MB model): their requests arrive in real time, about 57 s a pass; two passes
WORKLOADS=(-w low-resident -w stream-045 -w large-resident)
LIMIT_PYTEST=75
LIMIT_CALIBRATE=210
LIMIT_VALIDATE=180
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0
INCONCLUSIVE=0

step() {  # step NAME TIMEOUT_S LOGFILE CMD...
    local name="$1" limit="$2" log="$3"
    shift 3
    if [ "$DRY" -eq 1 ]; then
        echo "step $name limit=${limit}s: $*" | tee -a "$SUMMARY"
        return 0
    fi
    local t0 rc
    t0=$(date +%s)
    timeout "$limit" "$@" >"$log" 2>&1
    rc=$?
    echo "$rc" >"${log%.txt}.rc"
    echo "$name rc=$rc seconds=$(($(date +%s) - t0))" | tee -a "$SUMMARY"
    if [ "$name" = validate ] && [ "$rc" -eq 3 ]; then
        INCONCLUSIVE=1
    elif [ "$rc" -ne 0 ]; then
        FAILED=1
    fi
    return 0
}

TOTAL=$((LIMIT_PYTEST + LIMIT_CALIBRATE + LIMIT_VALIDATE))
if [ "$TOTAL" -gt "$BUDGET_S" ]; then
    echo "step limits add up to ${TOTAL}s, over the ${BUDGET_S}s budget" | tee -a "$SUMMARY"
    exit 1
fi
if [ "$DRY" -eq 1 ]; then
    echo "budget ${BUDGET_S}s, step limits ${TOTAL}s" | tee -a "$SUMMARY"
    pdsim validate --help >/dev/null 2>&1 || { echo "pdsim validate: not available"; exit 1; }
    pdsim calibrate --help >/dev/null 2>&1 || { echo "pdsim calibrate: not available"; exit 1; }
fi

if [ "$DRY" -eq 0 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
    python -c "from engine.backend import cupy_status; m, why = cupy_status(); print(why)" \
        >"$OUT/cupy_status.txt" 2>&1
fi

# 1. GPU tests (well under a minute and a half)
step pytest_gpu "$LIMIT_PYTEST" "$OUT/pytest_gpu.txt" python -m pytest -m gpu -q -p no:cacheprovider

# 2. GPU calibration (quick probes, CuPy op tables, then the engine probe: 2-3 minutes)
step calibrate "$LIMIT_CALIBRATE" "$OUT/calibrate.txt" \
    pdsim calibrate --backend gpu --quick --out "$OUT/profile-gpu.json" --workdir "$OUT/scratch"
rm -rf "$OUT/scratch"
if [ "$DRY" -eq 0 ] && [ -f "$OUT/profile-gpu.json" ]; then
    python - "$OUT/profile-gpu.json" >"$OUT/ops.txt" 2>&1 <<'PY'
import sys
from sim.serving.costmodel import load_profile
p = load_profile(sys.argv[1])
ops = p.ops
assert ops is not None and ops.engine is not None, "profile has no op tables / engine terms"
for t in ops.gemm:
    print("gemm", t.dtype, t.resident_bytes, t.kernel, t.origin.device, t.origin.framework,
          f"{len(t.grid.m)}x{len(t.grid.n)}x{len(t.grid.k)}")
for t in ops.attention:
    print("attention", t.phase, t.heads, t.kv_heads, t.head_dim, t.kv_dtype, t.origin.framework)
print("engine", ops.engine, "iteration_overhead_s", ops.roofline.iteration_overhead_s)
PY
fi

# 3. Validation on the GPU engine, all three checks: two engine runs of each of three
#    held-out workloads, interleaved, the reference workload timed between them
if [ "$DRY" -eq 1 ] || [ -f "$OUT/profile-gpu.json" ]; then
    step validate "$LIMIT_VALIDATE" "$OUT/validate.txt" pdsim validate --backend gpu \
        --repeats 2 --profile "$OUT/profile-gpu.json" --out "$OUT/validate" --json \
        "${WORKLOADS[@]}"
    [ "$DRY" -eq 1 ] || tail -n 1 "$OUT/validate.txt" >"$OUT/validate.json" 2>/dev/null || true
else
    echo "validate skipped: no profile was written" | tee -a "$SUMMARY"
    FAILED=1
fi
if [ "$FAILED" -ne 0 ]; then
    exit 1
fi
if [ "$INCONCLUSIVE" -ne 0 ]; then
    exit 3
fi
exit 0
