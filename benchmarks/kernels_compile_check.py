"""Compile our Triton kernels for sm_90 on a machine without a GPU, with the GPU box's Triton
version, and report what the compiler did: shared memory, registers and spills (ptxas -v), and
whether the big tile loads were software-pipelined (cp.async)

The device has triton 3.6; the CPU venv another version, so run this under a venv holding
triton 3.6 with the project's venv (torch) appended to its path:

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    /tmp/t36/bin/python -m benchmarks.kernels_compile_check --torch-site /work/venv/lib/python3.11/site-packages

Pointers and strides are marked 16-divisible as the runtime specialises them: without that the
analysis sees unaligned pointers and no load is vectorised or pipelined (a misleading result).
It caught, before a GPU call, a frontend error Triton 3.8's interpreter accepts (an annotated
constexpr reassigned in a `static_range` loop). Findings (2026-12-01): the decode kernel's
latent tile is pipelined but single-buffered (~94 KB of shared memory at any num_stages: three
72 KB bf16 tiles do not fit), and 4-warp tiles sit at 241-255 registers (spills with indices).
Each kernel with tensor-core instructions also gets its MMA loop from the disassembly (nvdisasm):
instructions, spills and barriers inside it. Findings (2026-12-07): the 4-row FP8 DSA prefill
scorer's 1.8 KB of spills are all in its query-quantising prologue (none in the key loop: 1,057
instructions per 128-key tile for 4 rows, ~8.3 warp instructions per key and row); the FP8 dense
decode tile (64, 4, 2) spills inside its loop (5 stores, 15 loads per iteration).
`--prefill-tiles rows:block_n:warps:stages[:maxnreg],...` compiles more DSA prefill variants.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def mma_loop(sass: list[str]) -> str:
    """The innermost loop around the first tensor-core instruction of a disassembled kernel: its
    SASS instruction count, spill stores/loads and barriers inside it (ptxas's spill total also
    counts a prologue that runs once per program; what a tile costs is the loop's)."""
    mma = next((i for i, ln in enumerate(sass) if "GMMA" in ln or " HMMA" in ln), None)
    if mma is None:
        return ""
    labels = {m[1]: i for i, ln in enumerate(sass) if (m := re.match(r"^(\.L_x_\d+):", ln))}
    for i in range(mma + 1, len(sass)):  # the first backward branch past the MMA closes its loop
        m = re.search(r"BRA `\((\.L_x_\d+)\)", sass[i])
        if m and labels.get(m[1], len(sass)) < mma:
            body = sass[labels[m[1]] : i + 1]
            n = sum(bool(re.search(r"/\*[0-9a-f]+\*/", ln)) for ln in body)
            mmas, stl, ldl, bars = (sum(op in ln for ln in body) for op in ("MMA.", "STL", "LDL", "BAR.SYNC"))
            return f" | MMA loop: {n} instructions, {mmas} MMA, {stl} spill stores, {ldl} spill loads, {bars} barriers"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-site", default=None, help="site-packages with torch (appended to sys.path)")
    ap.add_argument("--prefill-tiles", default="", help="more DSA prefill scorer variants: "
                    "'rows:block_n:warps:stages[:maxnreg],...' (e.g. 4:64:4:3)")  # fmt: skip
    args = ap.parse_args()
    fields = [[int(x) for x in spec.split(":")] for spec in args.prefill_tiles.split(",") if spec]
    extra_prefill = [(f[0], tuple(f[1:])) for f in fields]
    if args.torch_site:
        sys.path.append(args.torch_site)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import inference.kernels.dsa.fast as dsa

    try:
        from inference.kernels.dsa import PREFILL_ROWS as dsa_rows
    except ImportError:  # an older tree (compared against)
        dsa_rows = {}
    import inference.kernels.mla_decode.fast as dec

    target = GPUTarget("cuda", 90, 32)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    nvdisasm = os.path.join(os.path.dirname(ptxas), "nvdisasm")
    print(f"triton {triton.__version__}")

    def compile_one(name, fn, sig, const, div16, **opts):
        sig = {**sig, **dict.fromkeys(const, "constexpr")}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(sig) if a in div16}
        try:
            k = triton.compile(
                ASTSource(fn, signature=sig, constexprs=const, attrs=attrs), target=target, options=opts
            )
        except Exception as exc:  # a variant that does not compile (a sweep goes on)
            print(f"{name}: does not compile: {str(exc).strip().splitlines()[0][:200]}")
            return
        with tempfile.TemporaryDirectory() as d:
            Path(d, "k.ptx").write_text(k.asm["ptx"])
            r = subprocess.run(
                [ptxas, "-v", "--gpu-name=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                capture_output=True,
                text=True,
            )
            sass = subprocess.run(
                [nvdisasm, "-c", f"{d}/k.cubin"], capture_output=True, text=True
            ).stdout.splitlines()
        info = "; ".join(
            ln.split("info    :")[-1].strip()
            for ln in r.stderr.splitlines()
            if "registers" in ln or "spill" in ln
        )
        ttg = k.asm["ttgir"]
        # the instructions without debug info (line directives, the labels of inlined helpers'
        # ranges, the DWARF sections): equal digests = the same program (a refactor's check)
        ptx = k.asm["ptx"].split("\n\t.section\t.debug")[0]
        body = "\n".join(
            ln for ln in ptx.splitlines() if not ln.lstrip().startswith((".loc", ".file", "//", "$L__tmp"))
        )
        digest = hashlib.sha1(body.encode()).hexdigest()[:12]
        print(
            f"{name}: smem {k.metadata.shared} B, cp.async ops {ttg.count('async_copy_global_to_local')} | {info}"
            f" | ptx {digest}{mma_loop(sass)}"
        )

    ints = [
        "qk_scale",
        "num_idx",
        "s_qn",
        "s_qh",
        "s_rn",
        "s_rh",
        "s_bt",
        "s_idx",
        "s_on",
        "s_os",
        "s_oh",
        "s_ln",
        "s_ls",
    ]
    ptrs = [
        "q_ptr",
        "qr_ptr",
        "pool_ptr",
        "kvs_ptr",
        "bt_ptr",
        "lens_ptr",
        "idx_ptr",
        "trow_ptr",
        "o_ptr",
        "lse_ptr",
    ]
    div16 = set(ptrs) | {"s_qn", "s_qh", "s_rn", "s_rh", "s_on", "s_os", "s_oh", "s_ln", "s_ls"}
    for pool, scale in (("*bf16", False), ("*fp8e4nv", True)):
        for key, tile in dec.TILES.items():
            if (key[0] == "fp8") != scale or key[0] == "fp32":
                continue
            bn, w, st = tile
            sig = dict.fromkeys(ptrs, "*fp32") | {"pool_ptr": pool, "bt_ptr": "*i32", "lens_ptr": "*i32",
                                                  "idx_ptr": "*i64", "trow_ptr": "*i32"}  # fmt: skip
            sig |= dict.fromkeys(ints, "i32") | {"qk_scale": "fp32"}
            const = dict(H=16, H_PAD=16, R=512, R_PAD=512, P=64, P_PAD=64, ROW=576, PAGE=64, BLOCK_N=bn,
                         HAS_SCALE=scale, HAS_IDX=False, HAS_TROW=False, IEEE=False, HEAD_BLOCKS=1)  # fmt: skip
            compile_one(
                f"decode {key} {tile}", dec._split_kernel, sig, const, div16, num_warps=w, num_stages=st
            )
            # DeepSeek-V3.2's 128 heads: 8 head blocks of 16, dense and with DSA's indices
            for idx in (False, True):
                compile_one(
                    f"decode 128 heads idx={idx} {key} {tile}", dec._split_kernel, sig,
                    const | dict(H=128, HEAD_BLOCKS=8, HAS_IDX=idx, HAS_TROW=idx), div16,
                    num_warps=w, num_stages=st,
                )  # fmt: skip
    import inference.kernels.topk.fast as topk

    for pool, fp8 in (("*bf16", False), ("*fp8e4nv", True)):
        sig = {"q_ptr": "*bf16", "w_ptr": "*fp32", "pool_ptr": pool, "ks_ptr": "*fp32", "bt_ptr": "*i32",
               "lens_ptr": "*i32", "trow_ptr": "*i32", "out_ptr": "*fp32"} | dict.fromkeys(
            ["row0", "max_keys", "keys_per_prog", "scale", "s_qt", "s_qh", "s_wt", "s_pb", "s_kb", "s_bt",
             "s_ot"], "i32")  # fmt: skip
        sig["scale"] = "fp32"
        bn, w, st = dsa.SCORE_TILE["fp8" if fp8 else "bf16"]
        const = dict(HI=64, HI_PAD=64, D=128, D_PAD=128, PAGE=64, BLOCK_N=bn, HAS_TROW=False, FP8=fp8,
                     IEEE=False, STAGES=st)  # fmt: skip
        compile_one(
            f"dsa score {pool}", dsa._score_kernel, sig, const, {"q_ptr", "w_ptr", "pool_ptr", "out_ptr", "s_qt", "s_pb"},
            num_warps=w,
        )  # fmt: skip
        if hasattr(dsa, "_score_rows_kernel"):  # the prefill scorer, at the rows the model uses
            rsig = {**sig, "n_rows": "i32"}
            rsig = {k: rsig[k] for k in ("q_ptr", "w_ptr", "pool_ptr", "ks_ptr", "bt_ptr", "lens_ptr", "trow_ptr",
                                         "out_ptr", "row0", "n_rows", "max_keys", "keys_per_prog", "scale", "s_qt",
                                         "s_qh", "s_wt", "s_pb", "s_kb", "s_bt", "s_ot")}  # fmt: skip
            # the model's rows at the scorer's tile, then the asked-for variants
            variants = [(dsa_rows["fp8" if fp8 else "bf16"], (bn, w, st))]
            for rows, tile in variants + [v for v in extra_prefill if v not in variants]:
                rbn, rw, rst, maxnreg = (*tile, None)[:4]
                rconst = {k: v for k, v in const.items() if k != "HAS_TROW"} | {"R": rows, "BLOCK_N": rbn,
                                                                                "STAGES": rst}  # fmt: skip
                compile_one(
                    f"dsa prefill score {pool} x{rows} rows {tile}", dsa._score_rows_kernel, rsig,
                    rconst, {"q_ptr", "w_ptr", "pool_ptr", "out_ptr", "s_qt", "s_pb"}, num_warps=rw,
                    maxnreg=maxnreg,
                )  # fmt: skip
    ints = ["row0", "max_keys", "chunk", "s_st"]
    sig = {"s_ptr": "*fp32", "lens_ptr": "*i32", "state_ptr": "*i64", "hist_ptr": "*i32", "done_ptr": "*i32"}
    sig |= dict.fromkeys(ints, "i32")
    for done in (False, True):  # the radix path alone, and as the compact path's fallback
        for level, (shift, bits) in enumerate(topk._LEVELS):
            const = dict(LEVEL=level, SHIFT=shift, BITS=bits, NB=topk.NBINS, BLOCK=topk._BLOCK, HAS_DONE=done)
            compile_one(f"topk hist {level} done={done}", topk._hist_kernel, sig, const, {"s_ptr", "hist_ptr"},
                        num_warps=4)  # fmt: skip
    sig = {"hist_ptr": "*i32", "state_ptr": "*i64", "gt_ptr": "*i32", "ties_ptr": "*i32", "lens_ptr": "*i32",
           "krows_ptr": "*i32", "done_ptr": "*i32"} | dict.fromkeys(["row0", "max_keys", "width", "chunks"], "i32")  # fmt: skip
    for level, (shift, _bits) in enumerate(topk._LEVELS):
        const = dict(LEVEL=level, SHIFT=shift, LAST=level == len(topk._LEVELS) - 1, NB=topk.NBINS, HAS_K=True,
                     CB=topk._FIND_CHUNKS, HAS_DONE=True)  # fmt: skip
        compile_one(f"topk find {level}", topk._find_kernel, sig, const, {"hist_ptr"}, num_warps=4)
    sig = {"s_ptr": "*fp32", "lens_ptr": "*i32", "state_ptr": "*i64", "gt_ptr": "*i32", "ties_ptr": "*i32",
           "out_ptr": "*i64", "done_ptr": "*i32"} | dict.fromkeys(["row0", "max_keys", "width", "chunk", "s_st", "s_ot"], "i32")  # fmt: skip
    compile_one("topk gather", topk._gather_kernel, sig, dict(BLOCK=topk._BLOCK, CH_PAD=16, HAS_DONE=True), {"s_ptr"},
                num_warps=4)  # fmt: skip
    import inference.kernels.topk.compact as cpt

    ints = dict.fromkeys(["row0", "max_keys", "width", "s_st"], "i32")
    sig = {"s_ptr": "*fp32", "lens_ptr": "*i32", "krows_ptr": "*i32", "thr_ptr": "*i32",
           "cursor_ptr": "*i32"} | ints  # fmt: skip
    const = dict(HAS_K=True, CAP_=cpt.CAP, SEGS=cpt.SAMPLE_SEGS, SEG=cpt.SAMPLE_SEG)
    compile_one("topk compact guess", cpt._guess_kernel, sig, const, {"s_ptr", "s_st"}, num_warps=8)
    sig = {"s_ptr": "*fp32", "lens_ptr": "*i32", "thr_ptr": "*i32", "cursor_ptr": "*i32", "ckey_ptr": "*i32",
           "cpos_ptr": "*i32"} | dict.fromkeys(["row0", "max_keys", "chunk", "s_st"], "i32")  # fmt: skip
    compile_one("topk compact pass", cpt._compact_kernel, sig, dict(CAP_=cpt.CAP, BLOCK=cpt._BLOCK),
                {"s_ptr", "ckey_ptr", "cpos_ptr", "s_st"}, num_warps=4)  # fmt: skip
    sig = {"ckey_ptr": "*i32", "cpos_ptr": "*i32", "thr_ptr": "*i32", "cursor_ptr": "*i32", "lens_ptr": "*i32",
           "krows_ptr": "*i32", "done_ptr": "*i32", "out_ptr": "*i64"} | dict.fromkeys(["row0", "max_keys", "width",
                                                                                      "s_ot"], "i32")  # fmt: skip
    compile_one("topk compact select", cpt._select_kernel, sig, dict(HAS_K=True, CAP_=cpt.CAP, TAIL=cpt._BLOCK),
                {"ckey_ptr", "cpos_ptr", "out_ptr", "s_ot"}, num_warps=cpt._SELECT_WARPS)  # fmt: skip
    import inference.kernels.moe_gemm.fast as moe_gemm

    ints = ["stride_x", "stride_we", "stride_wn", "stride_o", "H", "INTER"]
    sig = {"X": "*bf16", "TOK": "*i64", "W": "*bf16", "ENDS": "*i32", "OUT": "*bf16"} | dict.fromkeys(
        ints, "i32"
    )
    for most, (bn, warps, stages) in moe_gemm.UP_TILES:
        const = dict(
            BLOCK_M=moe_gemm.BLOCK_M, BLOCK_N=bn, BLOCK_K=moe_gemm.BLOCK_K, IEEE=False, STAGES=stages
        )
        compile_one(f"moe up (gate|up + SwiGLU) <= {most} pairs", moe_gemm._moe_up_kernel, sig, const,
                    {"X", "W", "OUT", "stride_x", "stride_we", "stride_wn", "stride_o", "H", "INTER"}, num_warps=warps)  # fmt: skip
    ints = ["stride_a", "stride_we", "stride_wn", "stride_o", "N", "K"]
    sig = {"A": "*bf16", "W": "*bf16", "ENDS": "*i32", "OUT": "*bf16"} | dict.fromkeys(ints, "i32")
    for most, (bn, warps, stages) in moe_gemm.DOWN_TILES:
        const = dict(
            BLOCK_M=moe_gemm.BLOCK_M, BLOCK_N=bn, BLOCK_K=moe_gemm.BLOCK_K, IEEE=False, STAGES=stages
        )
        compile_one(f"moe down <= {most} pairs", moe_gemm._moe_down_kernel, sig, const,
                    {"A", "W", "OUT", "stride_a", "stride_we", "stride_wn", "stride_o", "N", "K"}, num_warps=warps)  # fmt: skip
    import inference.kernels.moe_router.fast as router

    # the benchmark config's router ([32, 2048], k 4) and Kimi-Linear-48B's ([256, 2304], k 8)
    for e, h, k in ((32, 2048, 4), (256, 2304, 8)):
        ep = 1 << (e - 1).bit_length()
        block_h, _chunk, splits = router.split_plan(h, e)
        sig = {"X": "*bf16", "WT": "*bf16", "P": "*fp32"} | dict.fromkeys(
            ["stride_x", "stride_w", "H", "E", "CHUNK", "S"], "i32"
        )
        const = dict(EP=ep, BLOCK_H=block_h)
        compile_one(f"router partial logits E={e} H={h}", router._partial_logits_kernel, sig, const,
                    {"X", "WT", "P", "stride_x", "stride_w"}, num_warps=4)  # fmt: skip
        sig = {
            "P": "*fp32",
            "B": "*fp32",
            "OUT_W": "*fp32",
            "OUT_I": "*i64",
            "E": "i32",
            "scale": "fp32",
            "S": "i32",
        }
        const = dict(K=k, KP=1 << (k - 1).bit_length(), EP=ep, SP=1 << (splits - 1).bit_length(), RENORM=True)
        compile_one(f"router select E={e} k={k}", router._select_kernel, sig, const, {"P"}, num_warps=4)


if __name__ == "__main__":
    main()
