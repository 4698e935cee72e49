#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU and CuPy, run the `gpu` tests, calibrate the GPU
# backend (--quick: hardware probes, then the sim.serving.opcost op tables -- GEMMs and attention --
# timed with CuPy, then the engine's own terms fitted on CuPy engine iterations) and
# validate that profile on held-out workloads; write everything under OUTDIR.
#
#   hwbench/gpu_check.sh OUTDIR            (run from the repository root, venv active)
#
# Budget: under 9 minutes in all (each step has its own timeout). Outputs:
#   OUTDIR/pytest_gpu.txt        the gpu tests' output      (+ pytest_gpu.rc)
#   OUTDIR/profile-gpu.json      the measured GPU profile   (+ calibrate.txt, calibrate.rc)
#   OUTDIR/ops.txt               the op tables' sources and sizes (from the profile)
#   OUTDIR/validate.txt          pdsim validate's table     (+ validate.json, validate.rc,
#                                validate/validate_cdf.png, validate/scenarios/)
#   OUTDIR/summary.txt           one line per step: name, exit status, seconds
# The script exits 0 when every step that ran passed, 1 otherwise (calibrate exits 1 when it
# rejects an impossible fit or an unsteady machine, validate when a figure is over its
# limit).
set -u
OUT="${1:?usage: hwbench/gpu_check.sh OUTDIR}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0

step() {  # step NAME TIMEOUT_S LOGFILE CMD...
    local name="$1" limit="$2" log="$3"
    shift 3
    local t0 rc
    t0=$(date +%s)
    timeout "$limit" "$@" >"$log" 2>&1
    rc=$?
    echo "$rc" >"${log%.txt}.rc"
    echo "$name rc=$rc seconds=$(($(date +%s) - t0))" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED=1
    return 0
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
python -c "from engine.backend import cupy_status; m, why = cupy_status(); print(why)" \
    >"$OUT/cupy_status.txt" 2>&1

# 1. GPU tests (well under 2 minutes)
step pytest_gpu 120 "$OUT/pytest_gpu.txt" python -m pytest -m gpu -q -p no:cacheprovider

# 2. GPU calibration (quick probes, CuPy op tables, then the engine probe: 2-3 minutes)
step calibrate 240 "$OUT/calibrate.txt" \
    pdsim calibrate --backend gpu --quick --out "$OUT/profile-gpu.json" --workdir "$OUT/scratch"
rm -rf "$OUT/scratch"
if [ -f "$OUT/profile-gpu.json" ]; then
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

# 3. Validation on the GPU engine: three held-out workloads of the suite (resident, streaming
#    at a cache fraction calibration never saw, the 67 MB model; requests arrive in real
#    time, about 70 s in all) so the whole check fits 8 min
if pdsim validate --help >/dev/null 2>&1 && [ -f "$OUT/profile-gpu.json" ]; then
    step validate 150 "$OUT/validate.txt" pdsim validate --backend gpu --repeats 1 \
        --profile "$OUT/profile-gpu.json" --out "$OUT/validate" --json \
        -w low-resident -w stream-045 -w large-resident
    tail -n 1 "$OUT/validate.txt" >"$OUT/validate.json" 2>/dev/null || true
else
    echo "validate skipped: 'pdsim validate' is not available (or no profile was written)" \
        | tee -a "$SUMMARY"
fi
exit "$FAILED"
