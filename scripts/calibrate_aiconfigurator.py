"""Regenerate the shipped op calibration (cost_model/data/aiconfigurator_<gpu>.json) from
NVIDIA AIConfigurator's measured vLLM kernel latencies.

    python scripts/calibrate_aiconfigurator.py PATH/TO/aiconfigurator [--out cost_model/data]

PATH holds ``h100_sxm/`` and ``h200_sxm/`` as in the ai-dynamo/aiconfigurator repository
(``aic-core/src/aiconfigurator_core/systems/data/<gpu>/``): ``gemm``, ``moe``, ``attention``
(context and generation), ``mla`` (generation module), ``sparse_attention`` (DeepSeek-V3.2's DSA
generation module) under ``vllm/<version>/`` (or
``vllm-<version>/``) and ``comm/nccl-<version>.parquet``. Needs pandas and pyarrow.

Per GPU and op family the rows are reduced to one latency per shape and dtype (the fastest of the
kernels vLLM offers there), split into a fit set and a held-out set by shape (crc32 of the shape
key, one in five held out: the rule tests/cost_model/test_efficiency.py fixes too), the curves of
``cost_model.efficiency`` fitted on the fit set only, and written with their held-out median and
p90 relative error, a subsample of the rows of both sets (what the tests evaluate on), the NCCL
latencies (half precision, bytes = elements x 2) and the provenance of every table (file, vLLM /
NCCL version from collection_meta.yaml). About 1 min; the output is ~100 KB per GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_model.efficiency import FAMILIES, fit_curve, roofline_parts  # noqa: E402
from cost_model.hardware import get_hardware  # noqa: E402

GPUS = {"h100": "h100_sxm", "h200": "h200_sxm"}
SHIP_ROWS = 160                  # rows per family and set (fit / held-out) written for the tests
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "fp4", "w4a16_mxfp4": "fp4"}
MLA_DTYPES = {**DTYPES, "fp8_block": "fp8"}          # MLA tables: block-fp8 projections
# family -> (table sub-directory, parquet stem, shape columns of the shipped rows)
TABLES = {
    "gemm": ("gemm", "gemm_perf", ("m", "n", "k")),
    "moe": ("moe", "moe_perf", ("tokens", "hidden", "inter", "topk", "experts", "tp", "ep", "skew")),
    "attention_decode": ("attention", "generation_attention_perf", ("batch", "ctx", "heads", "kv_heads", "head_dim",
                                                                    "window")),
    "attention_prefill": ("attention", "context_attention_perf", ("batch", "isl", "heads", "kv_heads", "head_dim",
                                                                   "window")),
    "mla_decode": ("mla", "mla_generation_module_perf", ("batch", "ctx", "heads")),
    "dsa_decode": ("sparse_attention", "dsa_generation_module_perf", ("batch", "ctx", "heads")),
}


def held_out(key: str) -> bool:
    """The fixed split: one shape in five (by crc32 of its key) is held out of the fit."""
    return zlib.crc32(key.encode()) % 5 == 0


def shape_key(family: str, dtype: str, shape: dict) -> str:
    return f"{family}|{dtype}|" + ",".join(f"{k}={shape[k]:g}" for k in sorted(shape))


def _table_dir(gpu_dir: Path, sub: str) -> Path:
    """The newest vllm version directory of a table (vllm/<v>/ or vllm-<v>/)."""
    cands = sorted([*gpu_dir.glob(f"{sub}/vllm-*"), *gpu_dir.glob(f"{sub}/vllm/*")])
    if not cands:
        raise SystemExit(f"error: no {sub}/vllm* directory under {gpu_dir}")
    return cands[-1]


def _version(meta: Path) -> str:
    m = re.search(r"^\s*version:\s*(\S+)", meta.read_text(), re.M) if meta.exists() else None
    return m.group(1) if m else "unknown"


def _rows(family: str, df) -> list[tuple[str, dict, float, str | None]]:
    """(dtype, shape, seconds, kv dtype) per measured row of one family's table."""
    import pandas as pd

    df = df.copy()
    if family == "gemm":
        df["dtype"] = df.gemm_dtype.map(DTYPES)
        cols = {"m": df.m, "n": df.n, "k": df.k}
    elif family == "moe":
        df["dtype"] = df.moe_dtype.map(DTYPES)
        skew = df.distribution.str.extract(r"power_law_([0-9.]+)")[0].astype(float).fillna(0.0)
        cols = {"tokens": df.num_tokens, "hidden": df.hidden_size, "inter": df.inter_size, "topk": df.topk,
                "experts": df.num_experts, "tp": df.moe_tp_size, "ep": df.moe_ep_size, "skew": skew}
    elif family in ("attention_decode", "attention_prefill"):
        df["dtype"] = df.kv_cache_dtype.map(DTYPES)
        cols = {"batch": df.batch_size, "heads": df.num_heads, "kv_heads": df.num_key_value_heads,
                "head_dim": df.head_dim, "window": df.window_size}
        if family == "attention_decode":
            cols["ctx"] = df.isl + df.step
        else:
            cols["isl"] = df.isl
    else:                                                            # mla_decode, dsa_decode
        if family == "dsa_decode":
            df = df[df.model == "deepseek-ai/DeepSeek-V3.2"]              # GLM-5's geometry differs
        df["dtype"] = df.gemm_type.map(MLA_DTYPES) + "/" + df.kv_cache_dtype.map(DTYPES)
        cols = {"batch": df.batch_size, "ctx": df.isl + df.step, "heads": df.num_heads}
    shape = pd.DataFrame(cols)
    shape["dtype"], shape["latency"] = df["dtype"], df["latency"]
    shape = shape.dropna(subset=["dtype"])
    best = shape.groupby([*cols, "dtype"], as_index=False)["latency"].min()   # the fastest kernel per shape
    out = []
    for r in best.itertuples(index=False):
        d = r._asdict()
        dt = d.pop("dtype")
        sec = d.pop("latency") / 1e3
        out.append((dt, {k: float(v) for k, v in d.items()}, sec))
    return out


def _errors(curve, hw, family, rows) -> np.ndarray:
    parts = np.array([_parts(hw, family, dt, s) for dt, s, _ in rows])
    y = np.array([t for _, _, t in rows])
    return np.abs(curve.seconds([s for _, s, _ in rows], parts[:, 0], parts[:, 1]) - y) / y


def _parts(hw, family, dt, shape):
    if family in ("mla_decode", "dsa_decode"):
        w, kv = dt.split("/")
        return roofline_parts(family, shape, hw, w, kv)
    return roofline_parts(family, shape, hw, dt)


def _subsample(rows: list, n: int, seed: int) -> list:
    if len(rows) <= n:
        return rows
    idx = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    return [rows[i] for i in sorted(idx)]


def calibrate_gpu(gpu: str, gpu_dir: Path) -> dict:
    import pandas as pd

    hw = get_hardware(gpu)
    doc = {"kind": "tkcc.op_curves", "gpu": gpu, "curves": {}, "held_out": {}, "samples": {}, "nccl": {},
           "provenance": {}}
    for family in FAMILIES:
        sub, stem, cols = TABLES[family]
        tdir = _table_dir(gpu_dir, sub)
        path = tdir / f"{stem}.parquet"
        rows = _rows(family, pd.read_parquet(path))
        doc["provenance"][family] = {"file": f"{GPUS[gpu]}/{sub}/{tdir.name}/{path.name}",
                                     "vllm_version": _version(tdir / "collection_meta.yaml"), "shapes": len(rows)}
        doc["curves"][family], doc["held_out"][family], doc["samples"][family] = {}, {}, {"columns": list(cols), "rows": []}
        for dt in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == dt]
            fit_rows = [r for r in mine if not held_out(shape_key(family, dt, r[1]))]
            test_rows = [r for r in mine if held_out(shape_key(family, dt, r[1]))]
            parts = np.array([_parts(hw, family, dt, s) for _, s, _ in fit_rows])
            curve = fit_curve(family, [s for _, s, _ in fit_rows], parts[:, 0], parts[:, 1], [t for _, _, t in fit_rows])
            err = _errors(curve, hw, family, test_rows)
            doc["curves"][family][dt] = curve.to_dict()
            doc["held_out"][family][dt] = {"rows": len(test_rows), "median": round(float(np.median(err)), 4),
                                           "p90": round(float(np.percentile(err, 90)), 4)}
            per = max(8, SHIP_ROWS * len(mine) // len(rows))
            for r in _subsample(fit_rows, per, 0) + _subsample(test_rows, per, 1):
                doc["samples"][family]["rows"].append([r[0], *[r[1][c] for c in cols], float(f"{r[2]:.5g}")])
            print(f"{gpu} {family:<18} {dt:<9} fit {len(fit_rows):>6}  held-out {len(test_rows):>5}  "
                  f"median {np.median(err):6.1%}  p90 {np.percentile(err, 90):6.1%}")
    nccl = sorted(gpu_dir.glob("comm/nccl-*.parquet"))[-1]
    df = pd.read_parquet(nccl)
    df = df[df.nccl_dtype == "half"]
    for op, name in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"), ("alltoall", "all_to_all"),
                     ("reduce_scatter", "reduce_scatter")):
        doc["nccl"][name] = {str(n): [[int(s) * 2, float(f"{t / 1e3:.5g}")] for s, t in
                                      g.sort_values("message_size")[["message_size", "latency"]].itertuples(index=False)]
                             for n, g in df[df.op_name == op].groupby("num_gpus")}
    doc["provenance"]["nccl"] = {"file": f"{GPUS[gpu]}/comm/{nccl.name}",
                                 "nccl_version": nccl.stem.split("-", 1)[1], "dtype": "half (bytes = elements x 2)"}
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", type=Path, help="directory holding h100_sxm/ and h200_sxm/")
    ap.add_argument("--out", type=Path, default=ROOT / "cost_model" / "data")
    args = ap.parse_args(argv)
    for gpu, sub in GPUS.items():
        if not (args.path / sub).is_dir():
            print(f"error: {args.path / sub} is not a directory", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu, sub in GPUS.items():
        doc = calibrate_gpu(gpu, args.path / sub)
        doc["source"] = ("NVIDIA AIConfigurator (github.com/ai-dynamo/aiconfigurator, "
                         "aic-core/src/aiconfigurator_core/systems/data), Apache-2.0; see cost_model/data/NOTICE.md")
        out = args.out / f"aiconfigurator_{gpu}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        tmp.replace(out)
        print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
