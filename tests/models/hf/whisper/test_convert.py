"""Whisper checkpoints: Hugging Face directories, CTranslate2 directories (made by ctranslate2's own
converter, at three precisions), the native bundle, and the refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from oasr.checkpoints.converter import DETECT_KEYED_VALUE
from oasr.checkpoints.loading import load_pretrained
from oasr.errors import CheckpointFormatError
from oasr.models.registry import converter_for, detect_architecture


def _hf_state(tiny_hf_dir) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model."): v for k, v in load_file(str(tiny_hf_dir / "model.safetensors")).items()}


def test_both_layouts_are_detected_as_whisper(tiny_hf_dir, ct2_dirs, tiny_en_dir):
    assert converter_for("whisper").detect_specificity == DETECT_KEYED_VALUE
    for path in (tiny_hf_dir, ct2_dirs["float32"], ct2_dirs["int8"], tiny_en_dir):
        assert detect_architecture(path) == "whisper"


def test_hf_directory_config_and_specs(tiny):
    config, gen = tiny.config, tiny.config.generation
    assert (config.d_model, config.encoder_layers, config.decoder_attention_heads, config.vocab_size) == (64, 2, 4, 51865)
    assert (gen.sot_id, gen.eot_id, gen.no_timestamps_id, gen.timestamp_begin) == (50258, 50257, 50363, 50364)
    assert (gen.transcribe_id, gen.translate_id, gen.sot_prev_id, gen.no_speech_id) == (50359, 50358, 50361, 50362)
    assert gen.languages["en"] == 50259 and len(gen.languages) == 99 and gen.is_multilingual
    assert gen.begin_suppress_tokens == (220, 50257)
    assert tiny.tokenizer_spec.kind == "whisper"
    assert tiny.feature_spec.kind == "whisper_logmel" and tiny.feature_spec.audio_scale == 1.0
    assert tiny.decoding_defaults.decode_type == "aed"
    assert tiny.load_report.missing == []


def test_sharded_safetensors_load_like_one_file(tmp_path, tiny_hf_dir, tiny):
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        shutil.copy(tiny_hf_dir / name, tmp_path / name)
    state = load_file(str(tiny_hf_dir / "model.safetensors"))
    keys = sorted(state)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    weight_map = {}
    for shard, names in shards.items():
        save_file({k: state[k] for k in names}, str(tmp_path / shard))
        weight_map.update({k: shard for k in names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_pretrained(tmp_path)
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


def test_ct2_float32_holds_exactly_the_hf_weights(ct2_dirs, tiny):
    ct2 = load_pretrained(ct2_dirs["float32"])
    assert ct2.config == tiny.config
    theirs = ct2.model.state_dict()
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(theirs[key], value), key


def test_ct2_float16_holds_the_hf_weights_rounded(ct2_dirs, tiny):
    ct2 = load_pretrained(ct2_dirs["float16"])
    theirs = ct2.model.state_dict()
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(theirs[key], value.half().float()), key


def test_ct2_int8_dequantizes_each_row_within_its_quantization_step(ct2_dirs, tiny):
    ct2 = load_pretrained(ct2_dirs["int8"])
    assert ct2.config == tiny.config
    theirs = ct2.model.state_dict()
    quantized = 0
    for key, value in tiny.model.state_dict().items():
        got = theirs[key]
        if key.endswith("weight") and value.dim() >= 2:
            rows = value.reshape(value.shape[0], -1)
            step = rows.abs().amax(dim=1, keepdim=True) / 127  # CTranslate2: scale = 127 / amax per row
            err = (got.reshape(rows.shape) - rows).abs()
            assert bool((err <= step / 2 + 1e-6).all()), key
            quantized += int(bool((err > 0).any()))
        else:
            assert torch.equal(got, value), key
    assert quantized > 10  # the weights really were int8


def test_ct2_directory_gives_the_same_tokens_as_its_hf_source(ct2_dirs, tiny, chirp_features):
    from oasr_models_hf.whisper.search import WindowTask, search_windows

    ct2 = load_pretrained(ct2_dirs["float32"])
    outputs = []
    for loaded in (tiny, ct2):
        with torch.no_grad():
            enc, _ = loaded.model.encode_offline(chirp_features.transpose(1, 2))
            ks, vs = loaded.model.decoder.cross_kv(enc)
            tasks = [WindowTask(prompt=[50258, 50259, 50359], sot_index=0, timestamps=True, max_new_tokens=25)
                     for _ in range(len(chirp_features))]
            outputs.append([r.tokens for r in search_windows(loaded.model.decoder, ks, vs, tasks,
                                                             loaded.config.generation)])
    assert outputs[0] == outputs[1]
    assert len({tuple(t) for t in outputs[0]}) == len(chirp_features)  # varied tokens: the check has teeth


def test_trained_tiny_en_from_the_ct2_wheel(tiny_en):
    loaded, tokenizer = tiny_en
    config, gen = loaded.config, loaded.config.generation
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.vocab_size) == (384, 4, 4, 51864)
    assert (gen.eot_id, gen.sot_id, gen.no_timestamps_id, gen.no_speech_id) == (50256, 50257, 50362, 50361)
    assert not gen.is_multilingual and gen.languages == {}
    assert len(gen.alignment_heads) == 8
    assert tokenizer.decode(tokenizer.encode(" Ever tried.")) == " Ever tried."


def test_native_bundle_round_trip(tmp_path, tiny):
    from oasr.checkpoints.native import load_native, save_native

    save_native(tiny, tmp_path / "bundle")
    stored = load_file(str(tmp_path / "bundle" / "model.safetensors"))
    assert "decoder.proj_out.weight" not in stored  # the tied projection is stored once, as the embedding
    again = load_native(tmp_path / "bundle")
    assert again.config == tiny.config
    assert again.model.decoder.proj_out.weight is again.model.decoder.embed_tokens.weight
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], value), key


def test_missing_tokenizer_is_refused(tmp_path, tiny_hf_dir):
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(tiny_hf_dir / name, tmp_path / name)
    with pytest.raises(CheckpointFormatError, match="tokenizer.json"):
        load_pretrained(tmp_path)


def test_unsupported_hf_config_is_refused(tmp_path, tiny_hf_dir):
    from oasr.errors import UnsupportedConfigError

    shutil.copytree(tiny_hf_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["activation_function"] = "relu"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="activation_function"):
        load_pretrained(tmp_path / "m")


def test_truncated_ct2_model_is_refused(tmp_path, ct2_dirs):
    shutil.copytree(ct2_dirs["float32"], tmp_path / "m")
    data = (tmp_path / "m" / "model.bin").read_bytes()
    (tmp_path / "m" / "model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match="truncated"):
        load_pretrained(tmp_path / "m")


def test_ct2_reader_resolves_aliases_and_scales(ct2_dirs):
    from oasr_models_hf.whisper.convert import read_ct2_model

    spec, revision, variables = read_ct2_model(ct2_dirs["int8"] / "model.bin")
    assert spec == "WhisperSpec" and revision >= 2
    weight = variables["decoder/embeddings/weight"]
    assert weight.dtype == np.int8 and variables["decoder/embeddings/weight_scale"].shape == (weight.shape[0],)
    # the output projection is stored as an alias of the embedding, its scale aliased with it
    assert variables["decoder/projection/weight"] is weight


def test_int8_native_bundle_round_trip(tmp_path, tiny, chirp_features):
    import copy
    import json

    import attrs

    from oasr.checkpoints.native import load_native, save_native
    from oasr.layers.quant import quantize_model_int8

    model = copy.deepcopy(tiny.model)
    section = quantize_model_int8(model)
    assert "decoder.proj_out" in section["layers"] and "encoder.layers.0.fc1" in section["layers"]
    save_native(attrs.evolve(tiny, model=model, quantization=section), tmp_path / "q")
    assert json.loads((tmp_path / "q" / "oasr_config.json").read_text())["format_version"] == 2
    stored = load_file(str(tmp_path / "q" / "model.safetensors"))
    assert stored["decoder.proj_out.weight"].dtype == torch.int8
    assert stored["decoder.embed_tokens.weight"].dtype == torch.float32
    again = load_native(tmp_path / "q")
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 440, 1000]])
    with torch.no_grad():
        want = model.decoder(tokens, model.encode_offline(chirp_features[:1].transpose(1, 2))[0])
        got = again.model.decoder(tokens, again.model.encode_offline(chirp_features[:1].transpose(1, 2))[0])
    assert torch.equal(got, want)
