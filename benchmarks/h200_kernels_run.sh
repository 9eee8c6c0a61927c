#!/usr/bin/env bash
# Kernel benchmarks then `gpu` tests in one run on a CUDA host (from the repository root; `python3` with torch, triton, fla):
#   phase 1, alone on the GPU: benchmarks/kernels.py (sections in $KERNEL_SECTIONS; skipped when
#   empty), then, with ENGINE=1, benchmarks/engine.py's decode sections;
#   phase 2, in parallel on the one GPU, sharing one Triton cache: the kernel tests ($TEST_GROUPS,
#   default all of tests/inference/kernels, the `gpu`-marked ones included), the fp32 end-to-end
#   greedy equivalence with the kernels on among them (tests/inference/kernels/test_engine_e2e_gpu.py:
#   the benchmark config's attention shapes in a 4-layer model, with and without DSA).
# Writes under $OUT (8 files at most): log.txt (tee it), tests.log, kernel_errors.{json,md}
# (max abs / rel error of every kernel-vs-reference comparison), kernels_bench.json,
# engine_bench.json (ENGINE=1), tc.tgz (the Triton cache, if under 16 MB: carry it to the next
# call as ./tc.tgz, it is unpacked first).
# decode_ops: the fused decode ops, the split router, the decode-size MoE GEMMs, KDA's fla paths
# incl. the recurrent one for short prefill chunks, and the bf16 graph-greedy check.
set -u
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc}
[ -f tc.tgz ] && tar xzf tc.tgz -C "$(dirname "$TRITON_CACHE_DIR")"
W=/tmp/h200run
mkdir -p "$W"
t0=$(date +%s)
stamp() { echo "[h200_run +$(($(date +%s) - t0))s] $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
P1=${P1_LIMIT:-150}
py_test() {  # name, files...
  local name=$1
  shift
  local s=$(date +%s)
  KERNEL_ERR_TABLE="$W/err_$name.json" timeout "$P1" python3 -m pytest -q -rs -p no:cacheprovider \
    --confcutdir=tests/inference --durations=8 "$@" >"$W/t_$name.log" 2>&1
  echo "exit $? after $(($(date +%s) - s)) s" >>"$W/t_$name.log"
}
stamp "phase 1: timed benchmarks"
if [ -n "${KERNEL_SECTIONS-copy,decode,sweep,dsa}" ]; then
  timeout "${KERNELS_LIMIT:-120}" python3 -m benchmarks.kernels --sections "${KERNEL_SECTIONS-copy,decode,sweep,dsa}" \
    2>&1 | cut -c1-400
  stamp "kernels done"
fi
engine_decode() {  # the tree to run in (its own benchmarks/engine.py and package)
  nvidia-smi -q -d CLOCK | grep --line-buffered -A3 -E "^ +(Clocks|Applications Clocks)$"
  (cd "$1" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout "${ENGINE_LIMIT:-150}" python3 -m benchmarks.engine \
    --sections decode,decode_long --skip-hf 2>&1 | grep --line-buffered -v "^ " | cut -c1-1200)
}
if [ "${ENGINE:-0}" = 1 ]; then
  # ENGINE_REF_DIR: another checkout (e.g. `git archive` of an older commit, carried), run first
  # on the same machine, for before/after decode figures at the same clocks
  if [ -n "${ENGINE_REF_DIR:-}" ]; then
    stamp "engine decode: reference tree $ENGINE_REF_DIR"
    engine_decode "$ENGINE_REF_DIR"
  fi
  stamp "engine decode: this tree"
  engine_decode "$PWD"
  stamp "engine done"
fi
stamp "phase 2: tests"
T=tests/inference/kernels
for group in ${TEST_GROUPS:-decode_topk prefill dsa_layer e2e_fp32 decode_ops}; do
  case $group in
  decode_ops) py_test decode_ops $T/test_decode_ops.py $T/test_moe_gemm.py $T/test_kda_varlen_fla.py \
    tests/inference/engine/test_decode_fast_paths_gpu.py & ;;
  decode_topk) py_test decode_topk $T/test_mla_decode.py $T/test_topk.py & ;;
  topk) py_test topk $T/test_topk.py & ;;
  prefill) py_test prefill $T/test_mla_prefill.py & ;;
  dsa_layer) py_test dsa_layer $T/test_dsa.py $T/test_mla_layer_gpu.py $T/test_fp8_cache.py \
    $T/test_engine_with_kernels.py & ;;
  dsa) py_test dsa $T/test_dsa.py & ;;
  layer) py_test layer $T/test_mla_layer_gpu.py & ;;
  e2e_fp32) py_test e2e_fp32 $T/test_engine_e2e_gpu.py & ;;
  e2e_dsa) py_test e2e_dsa $T/test_engine_e2e_gpu.py -k "mla+dsa" & ;;
  esac
done
wait
stamp "phase 2 done"
for f in "$W"/t_*.log; do
  echo "=== $f"
  tail -n 22 "$f"
done
python3 - "$W" "$OUT" <<'PYEOF'
import glob, json, sys
w, out = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(glob.glob(f"{w}/err_*.json")):
    rows += json.load(open(f))
json.dump(rows, open(f"{out}/kernel_errors.json", "w"), indent=1)
lines = ["| case | max abs err | max rel err | tol | ok |", "| --- | --- | --- | --- | --- |"]
lines += [f"| {e['case']} | {e['max_abs_err']:.3e} | {e['rel_err']:.3e} | {e['tol']:.0e} | "
          f"{'yes' if e['passed'] else 'NO'} |" for e in rows]
open(f"{out}/kernel_errors.md", "w").write("\n".join(lines) + "\n")
print(f"error table: {len(rows)} comparisons, {sum(not e['passed'] for e in rows)} over tolerance")
PYEOF
cat "$W"/t_*.log >"$OUT/tests.log" 2>/dev/null
tar czf "$OUT/tc.tgz" -C "$(dirname "$TRITON_CACHE_DIR")" "$(basename "$TRITON_CACHE_DIR")"
[ "$(stat -c %s "$OUT/tc.tgz")" -gt 16000000 ] && rm -f "$OUT/tc.tgz" && echo "tc.tgz over 16 MB: dropped"
ls -la "$OUT"
stamp "end"
