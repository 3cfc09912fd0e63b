"""Run by the vLLM venv's python (never imports tkcc): greedy generation of a checkpoint with vLLM's offline
``LLM`` and, optionally, a parse of ``vllm serve`` flags by vLLM's own argument parser.

    python vllm_export_driver.py CHECKPOINT OUT.json [FLAG ...]

Writes ``{"tokens": [[...], ...], "replaced": [...], "flags": {...}}``: the greedy token ids of PROMPTS, the
vLLM layer classes an out-of-tree plugin replaced, and (with FLAGs) the EngineArgs fields they set. Which
plugins load is the caller's ``VLLM_PLUGINS``.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")      # engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")               # GiB of KV cache

PROMPTS = ([1, 5, 9, 30, 77, 100, 3], [1, 2, 3], [7, 200, 45, 45, 12])
FIELDS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
          "decode_context_parallel_size", "dtype", "quantization", "kv_cache_dtype", "max_num_seqs",
          "max_num_batched_tokens", "long_prefill_token_threshold", "block_size", "enforce_eager")


def parse_flags(checkpoint: str, flags: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", checkpoint, *flags]))
    out = {f: getattr(args, f) for f in FIELDS}
    out["cudagraph_capture_sizes"] = args.compilation_config.cudagraph_capture_sizes
    return {k: (v if isinstance(v, (int, float, str, bool, list, type(None))) else str(v)) for k, v in out.items()}


def main() -> None:
    checkpoint, out, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    from vllm import LLM, SamplingParams
    from vllm.model_executor.custom_op import op_registry_oot

    llm = LLM(model=checkpoint, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=128,
              max_num_seqs=4, max_num_batched_tokens=128, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=12, detokenize=False, ignore_eos=True)
    results = llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], params, use_tqdm=False)
    doc = {"tokens": [list(r.outputs[0].token_ids) for r in results],
           "replaced": sorted(k for k, v in op_registry_oot.items() if v.__name__.startswith("Tkcc")),
           "flags": parse_flags(checkpoint, flags) if flags else None}
    with open(out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
