"""``tkcc plan export --plan DIR --to vllm OUT``: a plan as a pip-installable vLLM plugin package.

    OUT/pyproject.toml               package ``tkcc-plan-<model>-v<N>``, entry point group vllm.general_plugins
    OUT/README.md                    what was exported, what not and why, the ``vllm serve`` flags
    OUT/<pkg>/__init__.py            register(): what vLLM calls in every process that builds a model
    OUT/<pkg>/runtime.py             compiler/export/vllm_plugin_runtime.py verbatim (adapters, fallbacks, counting)
    OUT/<pkg>/manifest.json          exported ops (kernel file, sha256, verified dtypes and dims), the layers
                                     they replace, not-exported items with the reason, the serve flags
    OUT/<pkg>/kernels/<file>.py      the plan's kernel files, byte for byte

The plan is loaded with ``plan.load`` (every kernel file checked against ``kernel_sha256``; a tampered
plan is one line, exit 2) and the kernel bytes copied are checked again as they are read. OUT is built
in a temporary sibling directory and renamed into place: a failure leaves nothing behind.

Which op goes where (``VLLM_LAYERS``, read from vLLM 0.32's source): each exported op replaces a vLLM
``CustomOp`` layer class; an op with no such class (attention over tkcc's paged layout, fused MoE
experts, linear layers, tkcc's fused multi-op regions) is listed as not exported with its reason.
The flags come from the plan's accepted engine settings (the CONFIG of a config optimization) and its
parallelism layout (``parallelism.best``), only flags ``vllm serve`` accepts.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from compiler.plan import artifact as plan_mod
from compiler.validate import UsageError

RUNTIME_FILE = Path(__file__).with_name("vllm_plugin_runtime.py")
VLLM_VERSION = "0.32"               # the vLLM whose layer classes and flags this mapping was read from

_NORM = "vllm.model_executor.layers.layernorm"
_ACT = "vllm.model_executor.layers.activation"
_ROPE = "vllm.model_executor.layers.rotary_embedding"
# vLLM layer classes whose forward is RotaryEmbedding's (the cos/sin cache differs, the rotation does not)
ROTARY_CLASSES = ("RotaryEmbedding", "Llama3RotaryEmbedding", "LinearScalingRotaryEmbedding",
                  "NTKScalingRotaryEmbedding", "DynamicNTKScalingRotaryEmbedding", "YaRNScalingRotaryEmbedding")


@dataclass(frozen=True)
class VllmLayer:
    """A vLLM CustomOp class (module, class) and the runtime adapter that serves it."""

    module: str
    cls: str
    adapter: str


VLLM_LAYERS: dict[str, tuple[VllmLayer, ...]] = {
    "rms_norm": (VllmLayer(_NORM, "RMSNorm", "rms_norm"),),
    "fused_add_rms_norm": (VllmLayer(_NORM, "RMSNorm", "rms_norm"),),         # RMSNorm.forward(x, residual)
    "silu_and_mul": (VllmLayer(_ACT, "SiluAndMul", "silu_and_mul"),),
    "gelu_tanh_and_mul": (VllmLayer(_ACT, "GeluAndMul", "gelu_tanh_and_mul"),),   # approximate="tanh" only
    "rotary_embedding": tuple(VllmLayer(_ROPE, c, "rotary_embedding") for c in ROTARY_CLASSES),
}
NOT_MAPPED: dict[str, str] = {
    "attention_decode": "vLLM's attention runs in its attention backends over their own KV-cache layout, "
                        "not a CustomOp with tkcc's paged signature",
    "attention_prefill": "vLLM's attention runs in its attention backends over their own KV-cache layout, "
                         "not a CustomOp with tkcc's paged signature",
    "moe_experts": "vLLM's FusedMoE routes, quantizes and shards experts inside one layer (its quant method); "
                   "tkcc's moe_experts takes already-routed top-k ids: no safe one-to-one mapping",
    "moe_route": "routing happens inside vLLM's FusedMoE layer, not in a CustomOp of its own",
    "linear": "vLLM's linear layers dispatch to their quantization method, not to a CustomOp forward",
    "lm_head": "vLLM's logits come from its LogitsProcessor over the vocab-parallel embedding, not a CustomOp",
    "embedding": "vLLM's VocabParallelEmbedding is not a CustomOp",
    "sample": "sampling is vLLM's sampler, outside the model",
}
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
KNOB_FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
              "max_chunk_tokens": "--long-prefill-token-threshold", "kv_block_size": "--block-size"}


class ExportError(UsageError):
    """Bad input to ``plan export``: one line, exit 2."""


def verified_dtypes() -> list[str]:
    """The dtypes tkcc's op contract checks a kernel at (``check_op``'s default), as torch dtype names."""
    from persistent_engine.ops import check_op

    return [str(d).removeprefix("torch.") for d in inspect.signature(check_op).parameters["dtypes"].default]


def verified_dims(op: str, spec, points) -> list:
    """The trailing dims the plan's model feeds ``op`` at its workload points: D of ``x[..., D]``, or
    (head size, rotary dim) for rotary_embedding. Token and head counts are free (row-wise kernels)."""
    from persistent_engine.ops import registry

    dims = set()
    for p in points:
        for shape in registry.get(op).shapes(spec, p):
            dims.add((shape["Dh"], shape["R"]) if op == "rotary_embedding" else shape["x"][-1])
    return sorted(dims)


def _assigned(source: str, name: str) -> ast.expr | None:
    """The value last assigned to module-level ``name`` in ``source`` (never executed)."""
    found = None
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node.value
    return found


def override_keys(source: str) -> set[str]:
    """The op names of a kernel source's ``OVERRIDES`` dict literal (values are functions: keys only)."""
    value = _assigned(source, "OVERRIDES")
    if not isinstance(value, ast.Dict):
        return set()
    return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def config_literal(source: str) -> dict | None:
    """A kernel source's ``CONFIG`` dict literal (engine settings), None when it has none."""
    value = _assigned(source, "CONFIG")
    try:
        config = ast.literal_eval(value) if value is not None else None
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def _fused_ops() -> set[str]:
    from persistent_engine.ops import registry

    return {n for n in registry.names() if registry.get(n).composite}


def classify(plan: plan_mod.Plan, sources: dict[str, str], spec) -> tuple[list[dict], list[dict], dict]:
    """(exported ops, not-exported items, engine CONFIG) of a plan. ``sources``: kernel path -> source.
    A kernel exports op X when its optimization targets X, X maps to a vLLM layer and its OVERRIDES
    literal names X; config optimizations give the CONFIG (merged)."""
    exported, skipped, config = [], [], {}
    fused, dtypes = _fused_ops(), verified_dtypes()
    for o in plan.optimizations:
        src = sources.get(o.kernel, "")
        names, cfg = override_keys(src), config_literal(src)
        if cfg and not names:
            config.update(cfg)
            continue
        for op in o.targets:
            item = {"op": op, "optimization": o.name, "kernel": o.kernel}
            if op in VLLM_LAYERS and op in names:
                if any(e["op"] == op for e in exported):
                    skipped.append({**item, "reason": "another optimization of the plan already exports it"})
                    continue
                exported.append({**item, "sha256": hashlib.sha256(src.encode()).hexdigest(),
                                 "needs_gpu": "triton" in src and "@triton.jit" in src,
                                 "dtypes": dtypes, "dims": verified_dims(op, spec, plan.workload_points),
                                 "speedup": dict(o.speedup), "description": o.description})
            elif op in VLLM_LAYERS:
                skipped.append({**item, "reason": "its kernel's OVERRIDES literal does not name it"})
            elif op in fused:
                skipped.append({**item, "reason": "a tkcc fused region spanning several vLLM layers; vLLM has "
                                                  "no single layer to replace"})
            else:
                skipped.append({**item, "reason": NOT_MAPPED.get(op, "no vLLM CustomOp computes this op")})
    for v in plan.variants:             # per-bucket variants (compiler.plan.buckets): one kernel per CustomOp in vLLM
        sizes = "-".join(str(b) for b in v.get("batches", []))
        skipped.append({"op": f"the variant for decode batches {sizes}", "optimization": None, "kernel": v.get("kernel"),
                        "reason": "a vLLM CustomOp runs one kernel at every batch size: the plan's kernels serve "
                                  "these sizes too"})
    return exported, skipped, config


def serve_flags(plan: plan_mod.Plan, config: dict) -> tuple[list[str], list[dict]]:
    """``vllm serve`` flags of the plan's engine CONFIG and layout, and what could not become a flag."""
    flags, skipped = [], []
    best = (plan.parallelism or {}).get("best") or {}
    for knob, value in sorted(config.items()):
        if knob in KNOB_FLAGS:
            flags += [KNOB_FLAGS[knob], str(int(value))]
        elif knob == "cuda_graph" and value is False:
            flags.append("--enforce-eager")
        elif knob == "cuda_graph_batch_sizes":          # no graphs are captured under --enforce-eager
            if config.get("cuda_graph", True) is not False:
                flags += ["--compilation-config", json.dumps({"cudagraph_capture_sizes": sorted(map(int, value))})]
        elif knob != "cuda_graph":
            skipped.append({"setting": knob, "value": value, "reason": "no vllm serve flag"})
    if not best:
        if plan.parallelism:
            skipped.append({"setting": "parallelism", "value": None,
                            "reason": (plan.parallelism or {}).get("message") or "the plan chose no layout"})
        return flags, skipped
    for key, flag in (("tp", "--tensor-parallel-size"), ("pp", "--pipeline-parallel-size"),
                      ("dp", "--data-parallel-size"), ("dcp", "--decode-context-parallel-size")):
        if int(best.get(key, 1) or 1) > 1:
            flags += [flag, str(int(best[key]))]
    ep, group = int(best.get("ep", 1) or 1), int(best.get("tp", 1) or 1) * int(best.get("dp", 1) or 1)
    if ep > 1 and ep == group:
        flags.append("--enable-expert-parallel")
    elif ep > 1:
        skipped.append({"setting": "ep", "value": ep, "reason": f"vLLM's expert parallelism spans all tp x dp = "
                        f"{group} GPUs; ep {ep} with experts also split tensor-parallel has no flag"})
    dtype = best.get("dtype")
    if dtype in DTYPE_NAMES:
        flags += ["--dtype", DTYPE_NAMES[dtype]]
    elif dtype == "fp8":
        flags += ["--dtype", "bfloat16", "--quantization", "fp8"]
    elif dtype:
        skipped.append({"setting": "dtype", "value": dtype, "reason": "vLLM reads this quantization from a "
                        "checkpoint quantized that way (its quantization_config), not from a flag"})
    kv = best.get("kv_dtype")
    if kv == "fp8":
        flags += ["--kv-cache-dtype", "fp8"]
    elif kv and kv not in ("bf16", dtype):
        skipped.append({"setting": "kv_dtype", "value": kv, "reason": "no matching --kv-cache-dtype"})
    if "batch" in best and "max_num_seqs" not in config:
        flags += ["--max-num-seqs", str(int(best["batch"]))]
    elif "batch" in best:
        skipped.append({"setting": "parallelism batch", "value": best["batch"], "reason": "the plan's accepted "
                        f"engine setting max_num_seqs={config['max_num_seqs']} (measured) is used instead"})
    if int(best.get("replicas", 1) or 1) > 1:
        skipped.append({"setting": "replicas", "value": best["replicas"], "reason": "run that many vllm serve "
                        "instances behind a load balancer"})
    if best.get("pd", "colocated") != "colocated":
        skipped.append({"setting": "pd", "value": best["pd"], "reason": "prefill/decode disaggregation needs "
                        "vLLM's --kv-transfer-config for the deployment's transport"})
    return flags, skipped


def package_name(plan: plan_mod.Plan) -> str:
    """The Python package (and entry point) name: ``tkcc_plan_<model>_v<N>``."""
    slug = re.sub(r"[^a-z0-9]+", "_", Path(plan.model).parent.name.lower() if plan.model.endswith(".json")
                  else plan.model.lower()).strip("_") or "model"
    return f"tkcc_plan_{slug[:40]}_v{plan.version}"


def _spec(plan: plan_mod.Plan):
    from persistent_engine.models.spec import ModelSpec

    try:
        return ModelSpec.from_name(plan.model)
    except Exception as e:  # noqa: BLE001 - an unknown model is bad input, one line
        raise ExportError(f"plan export: cannot resolve the plan's model {plan.model!r} to the shapes its "
                          f"kernels were verified on ({type(e).__name__}: {e})") from None


def build(plan_dir: str | os.PathLike) -> tuple[plan_mod.Plan, Path, dict, dict[str, bytes]]:
    """(plan, version dir, manifest, kernel path -> verified bytes) of a plan, nothing written."""
    from compiler.plan.apply import verified_bytes

    plan, vdir = plan_mod.load(plan_dir)                       # PlanError on any tampered kernel file
    files = {o.kernel: verified_bytes(vdir / o.kernel, plan.kernel_sha256.get(o.kernel, ""))
             for o in plan.optimizations if o.kernel}
    sources = {k: v.decode() for k, v in files.items()}
    exported, skipped, config = classify(plan, sources, _spec(plan))
    flags, flag_skipped = serve_flags(plan, config)
    layers: dict[tuple, dict] = {}
    for e in exported:
        for layer in VLLM_LAYERS[e["op"]]:
            entry = layers.setdefault((layer.module, layer.cls), {"module": layer.module, "class": layer.cls,
                                                                   "adapter": layer.adapter, "ops": []})
            entry["ops"].append(e["op"])
    kept = {e["kernel"] for e in exported}
    manifest = {"schema": "tkcc.vllm_plugin/1", "plan": f"{plan.model} v{plan.version}", "model": plan.model,
                "version": plan.version, "hw": plan.hw, "package": package_name(plan), "vllm": VLLM_VERSION,
                "exported": exported, "layers": list(layers.values()), "not_exported": skipped,
                "config": config, "serve_flags": flags, "flags_not_exported": flag_skipped}
    return plan, vdir, manifest, {k: v for k, v in files.items() if k in kept}


def write_package(manifest: dict, kernels: dict[str, bytes], out: str | os.PathLike) -> Path:
    """Writes the package to ``out`` atomically (a temporary sibling renamed into place)."""
    from compiler.export.vllm_package_text import init_text, pyproject_text, readme_text

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"plan export: {out} already exists and is not an empty directory; "
                          "remove it or give another OUT")
    out.parent.mkdir(parents=True, exist_ok=True)
    pkg = manifest["package"]
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        files = {"pyproject.toml": pyproject_text(manifest), "README.md": readme_text(manifest),
                 f"{pkg}/__init__.py": init_text(manifest), f"{pkg}/runtime.py": RUNTIME_FILE.read_bytes(),
                 f"{pkg}/manifest.json": json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                 **{f"{pkg}/{rel}": data for rel, data in kernels.items()}}
        for rel, content in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(content.encode() if isinstance(content, str) else content)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export(plan_dir: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Exports the plan at ``plan_dir`` to the package directory ``out``; returns its manifest."""
    _, _, manifest, kernels = build(plan_dir)
    write_package(manifest, kernels, out)
    return manifest


def flags_line(manifest: dict) -> str:
    return shlex.join(["vllm", "serve", "MODEL", *manifest["serve_flags"]])
