"""compiler/serve/hf_checkpoint.py: a GGUF model written as an HF checkpoint directory round-trips. A tiny Llama
GGUF is written here as llama.cpp writes one (q/k rows permuted for its interleaved rotary, a byte-level
BPE tokenizer with merges and control tokens); ``tkcc serve --model DIR`` on the checkpoint written from it
loads the same weights (q/k back in HF's layout), the same logits, tokenizer, chat template and stop ids."""

import json

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("safetensors")

from compiler.serve.hf_checkpoint import export_model, write_hf_checkpoint  # noqa: E402
from compiler.serve.model import ModelLoadError, load_served_model, render_chat  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402
from persistent_engine.models.decoder import make_decoder  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 96, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute``: HF's half-split q/k rows -> interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path, hf: dict[str, np.ndarray], tokens: list[str]) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in hf.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, i, *rest = name.split(".")
            g = f"blk.{i}.{names['.'.join(rest[:-1])]}.weight"
        t = _permute(t, HEADS) if "q_proj" in name else _permute(t, KV_HEADS) if "k_proj" in name else t
        w.add_tensor(g, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, the HF tensors it was made from, its tokens)."""
    tokens = SPECIAL + _byte_chars() + ["he", "ll", "hell", "Ġw"]
    g = np.random.default_rng(0)
    hd = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (len(tokens), HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                   p + "self_attn.q_proj.weight": (HEADS * hd, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HEADS * hd),
                   p + "self_attn.k_proj.weight": (KV_HEADS * hd, HIDDEN),
                   p + "self_attn.v_proj.weight": (KV_HEADS * hd, HIDDEN),
                   p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, FFN)}
    hf = {k: (1.0 + 0.1 * g.standard_normal(s) if len(s) == 1 else 0.2 * g.standard_normal(s)).astype(np.float32)
          for k, s in shapes.items()}
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    _write_gguf(path, hf, tokens)
    return path, hf, tokens


def _logits(served, ids: list[int]) -> torch.Tensor:
    spec = served.spec
    model = make_decoder(spec, list(range(spec.num_layers)), served.params, "cpu", torch.float32)
    wl = make_workload(model, WorkloadPoint("prefill", 1, 0, len(ids)), token_ids=torch.tensor(ids), fill="zeros")
    return model.step(wl)


def test_gguf_to_checkpoint_round_trip(tiny, tmp_path):
    from safetensors.torch import load_file

    path, hf, _tokens = tiny
    src = load_served_model("tiny-llama", str(path))
    out = write_hf_checkpoint(src, tmp_path / "Tiny-Llama", bos=1, eos=2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == KV_HEADS
    assert cfg["tie_word_embeddings"] is True and cfg["rope_theta"] == 100000.0 and cfg["eos_token_id"] == 2
    written = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in written and set(written) == set(hf)
    for k, t in hf.items():                           # q/k rows back in HF's layout: the GGUF's permutation undone
        assert torch.equal(written[k], torch.from_numpy(t)), k

    ckpt = load_served_model(str(out))                # tkcc serve --model DIR
    assert ckpt.name == "Tiny-Llama" and ckpt.source == str(out)
    assert ckpt.spec.replace(name="x") == src.spec.replace(name="x")
    text = "hello world <|im_end|> well"
    ids = src.tokenizer.encode(text)
    assert ckpt.tokenizer.encode(text) == ids and 2 in ids and len(ids) < len(text.encode())   # merges, special
    assert ckpt.tokenizer.stop_ids == src.tokenizer.stop_ids == (0, 2)
    chat = [{"role": "user", "content": "hello"}]
    assert render_chat(ckpt.tokenizer, chat) == render_chat(src.tokenizer, chat)
    assert torch.equal(_logits(ckpt, ids), _logits(src, ids))
    gen = json.loads((out / "generation_config.json").read_text())
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    assert gen["eos_token_id"] == [0, 2] and tcfg["eos_token"] == "<|im_end|>" and tcfg["bos_token"] == "<|im_start|>"
    assert tcfg["chat_template"] == TEMPLATE


def test_export_keeps_gguf_special_ids_and_reuses_a_complete_checkpoint(tiny, tmp_path):
    path, _, _ = tiny
    out = export_model("tiny-llama", tmp_path / "ckpt", weights=str(path))
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert export_model("tiny-llama", out, weights=str(path)) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_random_weights_cannot_be_written(tmp_path):
    with pytest.raises(ModelLoadError, match="real weights"):
        write_hf_checkpoint(load_served_model("tiny-dense"), tmp_path / "x")


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks/serve_vs_vllm.py"
    spec = importlib.util.spec_from_file_location("serve_vs_vllm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_serve_vs_vllm_tkcc_side_json_and_table(tiny, tmp_path, capsys):
    """benchmarks/serve_vs_vllm.py without vLLM: the tkcc side on the tiny checkpoint (a real server and
    replay), its JSON, the table, and the server gone afterwards; greedy comparison and the ratio row."""
    import httpx

    bench = _bench()
    out = tmp_path / "r.json"
    rc = bench.main(["--sides", "tkcc", "--model", "tiny-llama", "--weights", str(tiny[0]), "--checkpoint",
                     str(tmp_path / "Tiny"), "--requests", "3", "--warmup-requests", "1", "--max-input", "12",
                     "--max-output", "3", "--rates", "20,40", "--greedy-tokens", "4", "--max-model-len", "64",
                     "--log-dir", str(tmp_path / "logs"), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["complete"] and doc["greedy"]["agree"] is None and doc["vllm_version"] is None
    (side,) = doc["sides"]
    assert [r["rate"] for r in side["runs"]] == [20, 40]
    run = side["runs"][0]
    assert run["model"] == "Tiny" and run["completed"] == 3 and run["output_tokens"] == 9 and run["server_cores"] > 0
    assert len(side["greedy"]) == len(bench.COMPLETION_PROMPTS + bench.CHAT_PROMPTS) and side["startup_s"] > 0
    with pytest.raises(httpx.HTTPError):              # the server was stopped
        httpx.get(side["url"] + "/v1/models", timeout=2)
    table = capsys.readouterr().out
    assert f"| tkcc serve | 20x | {side['startup_s']:.1f} | {run['output_tokens_per_s']:.1f} |" in table
    assert "tkcc / vLLM" not in table
    other = {**side, "side": "vllm", "greedy": side["greedy"][:-1] + ["something else"],
             "runs": [{**r, "output_tokens_per_s": r["output_tokens_per_s"] / 2} for r in side["runs"]]}
    doc2 = {**doc, "sides": [side, other], "vllm_version": "0.0"}
    g = bench.compare_greedy(doc2)
    assert g["agree"] is False and [m["prompt"] for m in g["mismatches"]] == [bench.CHAT_PROMPTS[-1]]
    table = bench.markdown_table(doc2)
    assert table.count("| tkcc / vLLM | ") == 2 and "| 1.00x | 2.00x |" in table and "| vLLM 0.0 | 40x |" in table


def test_serve_vs_vllm_without_vllm_exits_2(tmp_path, capsys):
    bench = _bench()
    assert bench.main(["--vllm-python", str(tmp_path / "none")]) == 2
    assert "no vLLM python at" in capsys.readouterr().err


def test_server_that_dies_while_starting_is_reported(tmp_path):
    import sys

    bench = _bench()
    cmd = [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match="exited 3 while starting.*boom"):
        with bench.Server("x", cmd, {}, bench.free_port(), tmp_path / "x.log", timeout_s=30):
            pass
