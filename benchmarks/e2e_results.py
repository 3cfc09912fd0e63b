"""``e2e_decode.py``'s results file: the targets it checks, reading, merging runs made apart.

    doc["targets"] = target_verdicts(doc["cases"])
    doc = merge_results(read_results(path), new_doc)      # a later run's case wins
"""

from __future__ import annotations

import json
from pathlib import Path

from compiler.plan import artifact as plan_mod

__all__ = ["TARGETS", "BenchError", "fmt", "merge_files", "merge_results", "print_targets", "read_results",
           "target_verdicts"]

# issues 10's and 22's targets: (model, batch or None for every batch, metric, minimum)
TARGETS = (("llama-1b", 1, "pct_floor", 85.0), ("llama-1b", 1, "vs_torch_compile", 1.6),
           ("llama-1b", 1, "vs_gptfast", 1.6), ("qwen3-moe", None, "vs_reference", 2.6),
           ("qwen3-moe", None, "vs_torch_compile", 1.3), ("qwen3-moe", None, "vs_gptfast", 1.3),
           ("deepseek-v3", None, "vs_reference", 2.0))


class BenchError(ValueError):
    """A user error of the benchmark: one line, exit 2."""

    user_error = True


def target_verdicts(rows: list[dict]) -> list[dict]:
    """The issues' targets checked against every row of the model (and batch) each one names."""
    out = []
    for model, batch, metric, minimum in TARGETS:
        for r in rows:
            if r["model"] != model or (batch is not None and r["batch"] != batch):
                continue
            value = r["pct_floor"]["tkcc_ms"] if metric == "pct_floor" else r["ratios"].get(metric)
            out.append({"model": model, "batch": r["batch"], "context": r["context"], "metric": metric,
                        "minimum": minimum, "value": value, "met": value is not None and value >= minimum})
    return out


def fmt(x: float | None, spec: str = "{:.3f}") -> str:
    """``x`` formatted by ``spec``; "-" for None."""
    return "-" if x is None else spec.format(x)


def print_targets(doc: dict) -> None:
    for t in doc["targets"]:
        print(f"target {t['model']} b{t['batch']} {t['metric']} >= {t['minimum']}: {fmt(t['value'], '{:.2f}')} "
              f"{'met' if t['met'] else 'NOT met'}")


def read_results(path: Path) -> dict:
    """A results file this script wrote (BenchError, one line, for anything else)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: not a readable results file ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise BenchError(f"{path}: not an e2e_decode results file (no 'cases' list)")
    return doc


def merge_results(old: dict, new: dict) -> dict:
    """``new`` with the cases of ``old`` it does not measure again (same model, layers, batch, context), the
    plans of the models only ``old`` has, and the targets re-checked. Cases keep their own ``date``, copy
    bandwidth and plan; the file's top level is ``new``'s."""
    ident = lambda r: (r["model"], tuple(r["layers"]), r["batch"], r["context"])  # noqa: E731
    done = {ident(r) for r in new["cases"]}
    kept = [r for r in old.get("cases", []) if ident(r) not in done]
    doc = {**new, "cases": kept + list(new["cases"])}
    doc["targets"] = target_verdicts(doc["cases"])
    kept_models = {r["model"] for r in kept} - {p["model"] for p in new.get("plans", [])}
    doc["plans"] = list(new.get("plans", [])) + [p for p in old.get("plans", []) if p["model"] in kept_models]
    return doc


def merge_files(paths: list[str], out: Path) -> int:
    """``--merge-from``: results of runs made apart (several machines or sessions) merged in the order given,
    a later file's case replacing an earlier one's; no measurement."""
    docs = [read_results(Path(p)) for p in paths]
    doc = docs[0]
    for d in docs[1:]:
        doc = merge_results(doc, d)
    doc["merged_from"] = [{"file": Path(p).name, "date": d.get("date")} for p, d in zip(paths, docs)]
    plan_mod.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print_targets(doc)
    print(f"wrote {out} ({len(doc['cases'])} cases from {len(paths)} files)")
    return 0
