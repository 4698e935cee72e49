#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU and CuPy, run the `gpu` tests, calibrate the GPU
# backend (--quick) and, when available, `pdsim validate`; write everything under OUTDIR.
#
#   hwbench/gpu_check.sh OUTDIR            (run from the repository root, venv active)
#
# Budget: under 8 minutes in all (each step has its own timeout). Outputs:
#   OUTDIR/pytest_gpu.txt        the gpu tests' output      (+ pytest_gpu.rc)
#   OUTDIR/profile-gpu.json      the measured GPU profile   (+ calibrate.txt, calibrate.rc)
#   OUTDIR/validate.txt          pdsim validate's table     (+ validate.json, validate.rc,
#                                validate/validate_cdf.png)
#   OUTDIR/summary.txt           one line per step: name, exit status, seconds
# The script exits 0 when every step that ran passed, 1 otherwise.
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

# 2. GPU calibration (quick probes, then the engine probe: about 1-2 minutes)
step calibrate 200 "$OUT/calibrate.txt" \
    pdsim calibrate --backend gpu --quick --out "$OUT/profile-gpu.json" --workdir "$OUT/scratch"
rm -rf "$OUT/scratch"

# 3. Validation on the GPU engine: three workloads of the suite (resident, streaming, long
#    context; requests arrive in real time, about 70 s in all) so the whole check fits 8 min
if pdsim validate --help >/dev/null 2>&1 && [ -f "$OUT/profile-gpu.json" ]; then
    step validate 150 "$OUT/validate.txt" pdsim validate --backend gpu --repeats 1 \
        --profile "$OUT/profile-gpu.json" --out "$OUT/validate" --json \
        -w low-resident-lru -w low-stream-lru -w long-context-lruk
    tail -n 1 "$OUT/validate.txt" >"$OUT/validate.json" 2>/dev/null || true
else
    echo "validate skipped: 'pdsim validate' is not available (or no profile was written)" \
        | tee -a "$SUMMARY"
fi
exit "$FAILED"
