import struct

import pytest
import torch

from persistent_engine.models.decoder import build_model
from persistent_engine.models.safetensors_io import SafetensorsDir, WeightsError, load_file, save_file
from persistent_engine.models.spec import ModelSpec
from persistent_engine.models.weights import init_params, internal_to_hf, param_specs, save_weights
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint


def _logits(model, seed=0):
    return model.step(make_workload(model, WorkloadPoint(phase="decode", batch=2, context=12), seed=seed, fill="model"))


@pytest.mark.parametrize("alias", ["tiny-dense", "tiny-moe", "tiny-mla", "minimax-m2.5", "qwen3-moe", "glm-5.2", "deepseek-v3.2", "minimax",
                                   "gpt-oss"])
def test_save_and_load_give_identical_logits(alias, tmp_path):
    spec = ModelSpec.from_name(alias)
    spec = spec if spec.hidden_size <= 64 else spec.scaled_down()
    model = build_model(spec, seed=7)
    path = tmp_path / "model.safetensors"
    save_weights(model, path)
    loaded = build_model(spec, weights=path)
    assert loaded.params.keys() == model.params.keys()
    assert all(torch.equal(loaded.params[k], v) for k, v in model.params.items())
    assert torch.equal(_logits(loaded), _logits(model))
    assert not torch.equal(_logits(build_model(spec, seed=8)), _logits(model))    # the weights matter


def test_hf_names_per_family(tmp_path):
    mm = ModelSpec.from_name("minimax-m2.5").scaled_down()
    names = set(internal_to_hf(mm, [0], init_params(mm, [0])))
    assert {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.0.block_sparse_moe.e_score_correction_bias",
            "model.layers.0.block_sparse_moe.experts.3.w1.weight", "model.layers.0.self_attn.q_norm.weight",
            "lm_head.weight"} <= names
    ds = ModelSpec.from_name("tiny-mla")
    names = set(internal_to_hf(ds, [0, 1], init_params(ds, [0, 1])))
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
            "model.layers.1.mlp.experts.15.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.self_attn.kv_b_proj.weight",
            "model.layers.0.self_attn.q_a_layernorm.weight"} <= names
    assert "lm_head.weight" not in internal_to_hf(ModelSpec.from_name("tiny-dense"), [],
                                                  init_params(ModelSpec.from_name("tiny-dense"), []))


def test_mla_rope_rows_are_deinterleaved_on_load(tmp_path):
    spec = ModelSpec.from_name("tiny-mla")
    model = build_model(spec, layers=[0])
    hf = internal_to_hf(spec, [0], model.params)
    kv_a = hf["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    lat, r = spec.kv_lora_rank, spec.qk_rope_head_dim
    internal = model.params["layers.0.kv_a_w"]
    assert torch.equal(kv_a[:lat], internal[:lat])
    assert torch.equal(kv_a[lat::2], internal[lat:lat + r // 2])          # HF interleaved pairs -> halves
    assert torch.equal(kv_a[lat + 1::2], internal[lat + r // 2:])


def test_missing_tensor_and_bad_shape_are_user_errors(tmp_path):
    spec = ModelSpec.from_name("tiny-dense")
    model = build_model(spec)
    hf = internal_to_hf(spec, model.layers, model.params)
    del hf["model.layers.1.mlp.down_proj.weight"]
    save_file(hf, tmp_path / "a.safetensors")
    with pytest.raises(WeightsError, match="lack tensor 'model.layers.1.mlp.down_proj.weight'"):
        build_model(spec, weights=tmp_path / "a.safetensors")
    with pytest.raises(WeightsError, match="no safetensors weights"):
        build_model(spec, weights=tmp_path / "nothing-here")
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(WeightsError, match="cannot read"):
        SafetensorsDir(tmp_path / "bad.safetensors")
    assert WeightsError.user_error


def test_sharded_directory_and_slices_read_only_what_they_need(tmp_path):
    spec = ModelSpec.from_name("tiny-moe")
    model = build_model(spec)
    hf = internal_to_hf(spec, model.layers, model.params)
    keys = sorted(hf)
    save_file({k: hf[k] for k in keys[::2]}, tmp_path / "model-00001.safetensors")
    save_file({k: hf[k] for k in keys[1::2]}, tmp_path / "model-00002.safetensors")
    part = build_model(spec, layers=[2], weights=tmp_path)
    assert torch.equal(part.params["layers.2.w2"], model.params["layers.2.w2"])
    assert set(part.params) == set(param_specs(spec, [2]))


def test_safetensors_roundtrip_dtypes_and_atomic_write(tmp_path):
    tensors = {"a": torch.randn(3, 4).bfloat16(), "b": torch.arange(5), "c": torch.randn(2).float(),
               "d": torch.zeros(0, 3)}
    save_file(tensors, tmp_path / "t.safetensors")
    back = load_file(tmp_path / "t.safetensors")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]       # no temp file left


def test_block_fp8_checkpoints_are_dequantised(tmp_path):
    spec = ModelSpec.from_name("tiny-dense")
    model = build_model(spec, dtype=torch.float32)
    hf = internal_to_hf(spec, model.layers, model.params)
    name = "model.layers.0.mlp.down_proj.weight"                          # [64, 128]: 1 x 1 blocks of 128
    w = hf[name]
    scale = w.abs().max() / 448.0
    hf[name] = (w / scale).to(torch.float8_e4m3fn)
    hf[name + "_scale_inv"] = scale.reshape(1, 1)
    save_file(hf, tmp_path / "fp8.safetensors")
    loaded = build_model(spec, weights=tmp_path / "fp8.safetensors", dtype=torch.float32)
    err = (loaded.params["layers.0.down_w"] - w).abs().max() / w.abs().max()
    assert 0 < err < 0.07
