"""The generated files of a vLLM plugin package (``compiler.export.vllm_package``): pyproject.toml, the package's
``__init__.py`` and README.md, each from the package's manifest."""

from __future__ import annotations

import shlex

FALLBACKS = {
    "rms_norm": "a weightless RMSNorm or one with var_hidden_size; a weight dtype other than the input's",
    "fused_add_rms_norm": "as rms_norm; a residual of another dtype or shape",
    "silu_and_mul": "-",
    "gelu_tanh_and_mul": "GeluAndMul with approximate other than \"tanh\"",
    "rotary_embedding": "key None (cross-layer KV sharing); GPT-J (non-neox) style",
}


def pyproject_text(m: dict) -> str:
    pkg = m["package"]
    return f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{pkg.replace('_', '-')}"
version = "{m['version']}"
description = "tkcc plan {m['plan']} as a vLLM plugin (out-of-tree CustomOps)"
readme = "README.md"
requires-python = ">=3.10"

[project.entry-points."vllm.general_plugins"]
{pkg} = "{pkg}:register"

[tool.setuptools]
packages = ["{pkg}"]

[tool.setuptools.package-data]
{pkg} = ["manifest.json", "kernels/*.py"]
"""


def init_text(m: dict) -> str:
    return f'''"""tkcc plan {m['plan']} exported for vLLM: ``register`` is the vllm.general_plugins entry point."""

from pathlib import Path


def register():
    """Replaces the vLLM layers of manifest.json with the plan's kernels (runtime.register_plan)."""
    from {m['package']}.runtime import register_plan

    return register_plan(Path(__file__).parent)
'''


def _dims(op: str, dims: list) -> str:
    if op == "rotary_embedding":
        return ", ".join(f"head {d[0]} / rotary {d[1]}" for d in dims) or "none"
    return ", ".join(str(d) for d in dims) or "none"


def readme_text(m: dict) -> str:
    pkg, flags = m["package"], m["serve_flags"]
    lines = [f"# {pkg}: tkcc plan {m['plan']} for vLLM", "",
             f"Written by `tkcc plan export --to vllm` from the plan of `{m['model']}` (version {m['version']}, "
             f"planned for {m['hw']}); layer classes and flags read from vLLM {m['vllm']}.", "",
             "```bash", "pip install .", f"VLLM_PLUGINS={pkg} vllm serve MODEL {shlex.join(flags)}".rstrip(), "```",
             "", "vLLM loads every installed `vllm.general_plugins` entry point unless `VLLM_PLUGINS` names the "
             f"ones to load; `VLLM_PLUGINS={pkg}` loads this one alone, and a `VLLM_PLUGINS` without it turns it "
             "off. With `TKCC_VLLM_COUNTS=DIR` each process writes `DIR/counts-<pid>.json`: per op, how many "
             "calls ran the plan's kernel and how many fell back to vLLM's own forward (eager mode).", "",
             "## Exported", ""]
    if m["exported"]:
        lines += ["| tkcc op | vLLM layer | kernel | verified dtypes | verified last dims | speedup (fast / slow) |",
                  "|---|---|---|---|---|---|"]
        for e in m["exported"]:
            layers = ", ".join(f"`{lay['class']}`" for lay in m["layers"] if e["op"] in lay["ops"])
            sp = e.get("speedup", {})
            lines.append(f"| {e['op']} | {layers} | `{e['kernel']}` | {', '.join(e['dtypes'])} | "
                         f"{_dims(e['op'], e['dims'])} | {sp.get('fast', 'n/a')} / {sp.get('slow', 'n/a')} |")
        lines += ["", "Speedups are the plan's, measured by tkcc against its own reference ops on the plan's "
                  "device, not inside vLLM.", "", "### When vLLM's own forward runs instead", "",
                  "Every exported op falls back to the vLLM layer's own forward for a call its kernel was not "
                  "verified on: a dtype outside the verified ones, a last dimension the plan's model does not "
                  "feed the op (under tensor parallelism the per-GPU widths of the MLP differ: vLLM's forward "
                  "runs there), and for a Triton kernel any tensor that is not on a GPU (Triton has no CPU "
                  "backend inside vLLM). Token and head counts are free. Per op besides:", ""]
        lines += [f"- {e['op']}: {FALLBACKS.get(e['op'], '-')}" + (" (Triton kernel: GPU only)" if e["needs_gpu"]
                                                                  else "") for e in m["exported"]]
        lines += ["", "The layers' `forward` is replaced whatever `--compilation-config custom_ops` says. Under "
                  "vLLM's torch.compile (its default on a GPU) the kernels are traced into the graph; "
                  "`--enforce-eager` runs them as tkcc verified them."]
    else:
        lines.append("Nothing: no kernel of the plan maps to a vLLM layer (see below).")
    lines += ["", "## Not exported", ""]
    lines += [f"- {s['op']} (`{s['kernel']}`): {s['reason']}" for s in m["not_exported"]] or ["- nothing"]
    lines += ["", "## vllm serve flags", ""]
    lines += ["```", shlex.join(flags) or "(none)", "```", ""]
    if m["config"]:
        lines.append("Engine settings of the plan: " + ", ".join(f"{k}={v}" for k, v in sorted(m["config"].items()))
                     + ".")
    lines += [f"- {s['setting']} = {s['value']}: not a flag ({s['reason']})" for s in m["flags_not_exported"]]
    return "\n".join(lines) + "\n"
