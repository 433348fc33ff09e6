"""WenetConverter: detection, specs, refusals, the AED drop, CMVN forms, strict and native loading."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import oasr
from oasr.checkpoints import DETECT_NAMED_CONFIG
from oasr.checkpoints.native import save_native
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.models.registry import detect_architecture
from oasr_models_wenet.convert import WenetConverter, read_cmvn

from ._helpers import assert_rel


def _edit_yaml(directory: Path, edit) -> None:
    file = directory / "train.yaml"
    conf = yaml.safe_load(file.read_text())
    edit(conf)
    file.write_text(yaml.safe_dump(conf))


def _set(dotted: str, value):
    def edit(conf):
        *parents, last = dotted.split(".")
        node = conf
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return edit


def _offline(model, fbank: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.forward_offline(fbank[None], torch.tensor([fbank.size(0)]))[0][0]


def test_directory_is_detected_as_conformer(model_dir):
    assert WenetConverter.detect_specificity == DETECT_NAMED_CONFIG == 20
    assert detect_architecture(model_dir) == "conformer"


def test_from_pretrained_by_detection_matches_wenet(model_dir, refs):
    model = oasr.from_pretrained(model_dir)
    assert type(model).__name__ == "ConformerModel"
    assert model.capabilities == {"ctc", "ctc_aed_rescoring"}
    assert_rel(_offline(model, refs["clip1"]["fbank"]), refs["clip1"]["offline.ctc_log_probs"])


def test_specs_travel_with_the_checkpoint(loaded, model_dir):
    tok = loaded.tokenizer_spec
    assert tok.kind == "symbol_table"
    assert Path(tok.files["units"]) == (model_dir / "units.txt").resolve()
    assert Path(tok.files["units"]).is_absolute()
    assert tok.special_ids == (0, 49)
    feat = loaded.feature_spec
    assert (feat.kind, feat.sample_rate, feat.num_mel_bins) == ("kaldi_fbank", 16000, 80)
    assert (feat.frame_length_ms, feat.frame_shift_ms, feat.window_type) == (25.0, 10.0, "povey")
    assert feat.dither == 0.0  # train.yaml says 1.0 (training); inference never dithers
    assert (feat.snip_edges, feat.high_freq, feat.audio_scale) == (True, 0.0, 32768.0)
    dec = loaded.decoding_defaults
    assert (dec.decode_type, dec.blank_id, dec.sos_id, dec.eos_id) == ("ctc", 0, 49, 49)
    assert dec.options == {"beam_size": 10, "ctc_weight": 0.5, "reverse_weight": 0.3}
    cfg = loaded.config
    assert (cfg.decoder.sos_id, cfg.decoder.eos_id, cfg.decoder.reverse_weight) == (49, 49, 0.3)
    assert (cfg.decoder.num_blocks, cfg.decoder.r_num_blocks, cfg.decoder.bidirectional) == (2, 1, True)


def test_load_is_clean_and_strict(loaded):
    # every model tensor filled; only the computed positional tables are left over
    assert loaded.load_report.missing == []
    assert all(key.endswith(".pe") for key in loaded.load_report.dropped)


def test_sos_eos_follow_special_tokens_else_vocab_minus_one(wenet_copy):
    _edit_yaml(wenet_copy, _set("tokenizer_conf.special_tokens", {"<blank>": 0, "<sos>": 2, "<eos>": 3}))
    config = WenetConverter().convert(wenet_copy).model_config
    assert (config.decoder.sos_id, config.decoder.eos_id) == (2, 3)
    _edit_yaml(wenet_copy, lambda conf: conf["tokenizer_conf"].pop("special_tokens"))
    converted = WenetConverter().convert(wenet_copy)
    assert (converted.model_config.decoder.sos_id, converted.decoding.eos_id) == (49, 49)


REFUSED = [
    ("encoder", "transformer", "encoder"),
    ("model", "transducer", "model"),
    ("ctc", "ctc_other", "ctc"),
    ("model_conf.ctc_weight", 0.0, "model_conf.ctc_weight"),
    ("encoder_conf.pos_enc_layer_type", "abs_pos", "encoder_conf.pos_enc_layer_type"),
    ("encoder_conf.selfattention_layer_type", "selfattn", "encoder_conf.selfattention_layer_type"),
    ("encoder_conf.layer_norm_type", "rms_norm", "encoder_conf.layer_norm_type"),
    ("encoder_conf.cnn_module_norm", "rms_norm", "encoder_conf.cnn_module_norm"),
    ("encoder_conf.concat_after", True, "encoder_conf.concat_after"),
    ("encoder_conf.activation_type", "gelu", "encoder_conf.activation_type"),
    ("encoder_conf.input_layer", "linear", "encoder_conf.input_layer"),
    ("encoder_conf.normalize_before", False, "encoder_conf.normalize_before"),
    ("encoder_conf.mlp_type", "moe", "encoder_conf.mlp_type"),
    ("encoder_conf.n_kv_head", 2, "encoder_conf.n_kv_head"),
    ("encoder_conf.some_new_knob", 1, "encoder_conf.some_new_knob"),
    ("dataset_conf.feats_type", "log_mel_spectrogram", "dataset_conf.feats_type"),
]


@pytest.mark.parametrize("dotted,value,key", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_configuration_is_refused_naming_the_key(wenet_copy, dotted, value, key):
    _edit_yaml(wenet_copy, _set(dotted, value))
    with pytest.raises(UnsupportedConfigError) as info:
        oasr.load_pretrained(wenet_copy)
    assert info.value.key == key
    assert key in str(info.value)


def test_static_chunk_without_dynamic_chunk_is_refused(wenet_copy):
    _edit_yaml(wenet_copy, lambda conf: conf["encoder_conf"].update(static_chunk_size=16, use_dynamic_chunk=False))
    with pytest.raises(UnsupportedConfigError, match="encoder_conf.static_chunk_size") as info:
        oasr.load_pretrained(wenet_copy)
    assert info.value.key == "encoder_conf.static_chunk_size"


def test_static_chunk_beside_dynamic_chunk_loads(wenet_copy, refs):
    _edit_yaml(wenet_copy, _set("encoder_conf.static_chunk_size", 16))
    model = oasr.from_pretrained(wenet_copy)
    assert_rel(_offline(model, refs["clip0"]["fbank"]), refs["clip0"]["offline.ctc_log_probs"])


@pytest.mark.parametrize("dotted,value", [
    ("decoder_conf.src_attention", False),
    ("decoder_conf.some_new_knob", 3),
    ("decoder", "sanm_decoder"),
    ("model_conf.apply_non_blank_embedding", True),
])
def test_unbuildable_decoder_drops_the_aed_branch_with_a_hint(wenet_copy, refs, dotted, value):
    _edit_yaml(wenet_copy, _set(dotted, value))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = oasr.load_pretrained(wenet_copy)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(dotted in m for m in messages), messages  # the converter names the key
    assert any("'decoder.'" in m and "ctc_aed_rescoring" in m for m in messages), messages  # the capability hint
    model = loaded.model
    assert model.decoder is None and model.capabilities == {"ctc"}
    assert loaded.load_report.missing == []
    assert "ctc_weight" not in loaded.decoding_defaults.options
    assert_rel(_offline(model, refs["clip0"]["fbank"]), refs["clip0"]["offline.ctc_log_probs"])


def test_plain_transformer_decoder_is_remapped_into_left_decoder(wenet_copy, model_dir, refs):
    state = torch.load(model_dir / "final.pt", weights_only=True)
    plain = {}
    for key, value in state.items():
        if key.startswith("decoder.right_decoder."):
            continue
        plain[key.replace("decoder.left_decoder.", "decoder.", 1)] = value
    torch.save(plain, wenet_copy / "final.pt")
    _edit_yaml(wenet_copy, _set("decoder", "transformer"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loaded = oasr.load_pretrained(wenet_copy)
    model = loaded.model
    assert model.capabilities == {"ctc", "ctc_aed_rescoring"}
    assert model.decoder.right_decoder is None
    ref = refs["clip0"]
    hyps = [[int(t) for t in row if t >= 0] for row in ref["offline.prefix_nbest"]]
    with torch.no_grad():
        hidden, lens = model.encode_offline(ref["fbank"][None], torch.tensor([ref["fbank"].size(0)]))
        scored = model.decoder.rescore(hidden, lens, [hyps], reverse_weight=0.3)[0].scores
    lp = ref["offline.decoder_log_probs"]
    expected = torch.stack([lp[i, torch.arange(len(h) + 1), torch.tensor(h + [49])].sum() for i, h in enumerate(hyps)])
    assert_rel(scored, expected, 1e-5)  # left decoder only: reverse_weight has nothing to weigh


def _stats(model_dir: Path) -> dict:
    return json.loads((model_dir / "global_cmvn").read_text())


def test_json_cmvn_gives_the_checkpoints_cmvn(model_dir):
    mean, istd = read_cmvn(model_dir / "global_cmvn")
    state = torch.load(model_dir / "final.pt", weights_only=True)
    assert_rel(mean, state["encoder.global_cmvn.mean"], 1e-6)
    assert_rel(istd, state["encoder.global_cmvn.istd"], 1e-6)


def test_kaldi_text_cmvn_equals_json(model_dir, tmp_path):
    stats = _stats(model_dir)
    count = stats["frame_num"]
    text = ("[ " + " ".join(repr(v) for v in stats["mean_stat"]) + f" {count!r}\n  "
            + " ".join(repr(v) for v in stats["var_stat"]) + " 0 ]\n")
    (tmp_path / "kaldi_cmvn").write_text(text)
    for a, b in zip(read_cmvn(tmp_path / "kaldi_cmvn", is_json=False), read_cmvn(model_dir / "global_cmvn"), strict=True):
        assert torch.equal(a, b)
    (tmp_path / "binary").write_bytes(b"\0BDM ...")
    with pytest.raises(CheckpointFormatError, match="binary Kaldi CMVN"):
        read_cmvn(tmp_path / "binary")


def test_checkpoint_cmvn_wins_over_the_file(wenet_copy, refs):
    stats = _stats(wenet_copy)
    stats["mean_stat"] = [0.0] * len(stats["mean_stat"])
    (wenet_copy / "global_cmvn").write_text(json.dumps(stats))
    model = oasr.from_pretrained(wenet_copy)
    assert_rel(_offline(model, refs["clip0"]["fbank"]), refs["clip0"]["offline.ctc_log_probs"])


@pytest.mark.parametrize("form", ["json", "kaldi"])
def test_cmvn_file_fills_a_checkpoint_without_it(wenet_copy, refs, form):
    state = torch.load(wenet_copy / "final.pt", weights_only=True)
    del state["encoder.global_cmvn.mean"], state["encoder.global_cmvn.istd"]
    torch.save(state, wenet_copy / "final.pt")
    if form == "kaldi":
        stats = _stats(wenet_copy)
        (wenet_copy / "global_cmvn").write_text(
            "[ " + " ".join(map(repr, stats["mean_stat"])) + f" {stats['frame_num']!r}\n"
            + " ".join(map(repr, stats["var_stat"])) + " 0 ]\n")
        _edit_yaml(wenet_copy, _set("cmvn_conf.is_json_cmvn", False))
    model = oasr.from_pretrained(wenet_copy)
    assert_rel(_offline(model, refs["clip0"]["fbank"]), refs["clip0"]["offline.ctc_log_probs"])
    (wenet_copy / "global_cmvn").unlink()
    with pytest.raises(CheckpointFormatError, match="global CMVN"):
        oasr.load_pretrained(wenet_copy)


def test_checkpoint_file_resolution(wenet_copy):
    (wenet_copy / "final.pt").rename(wenet_copy / "avg_10.pt")
    assert WenetConverter().checkpoint_file(wenet_copy).name == "avg_10.pt"
    (wenet_copy / "epoch_3.pt").write_bytes((wenet_copy / "avg_10.pt").read_bytes())
    with pytest.raises(CheckpointFormatError, match="checkpoint_name"):
        WenetConverter().checkpoint_file(wenet_copy)
    assert WenetConverter(checkpoint_name="epoch_3.pt").convert(wenet_copy).state_dict
    with pytest.raises(CheckpointFormatError, match="outside"):
        WenetConverter(checkpoint_name="../final.pt").checkpoint_file(wenet_copy)


def test_a_checkpoint_missing_a_tensor_fails_the_load(wenet_copy):
    state = torch.load(wenet_copy / "final.pt", weights_only=True)
    del state["encoder.encoders.1.conv_module.depthwise_conv.weight"]
    torch.save(state, wenet_copy / "final.pt")
    with pytest.raises(CheckpointFormatError, match="depthwise_conv.weight"):
        oasr.load_pretrained(wenet_copy)


def test_native_bundle_round_trip_is_identical(loaded, refs, tmp_path):
    save_native(loaded, tmp_path / "bundle")
    again = oasr.load_pretrained(tmp_path / "bundle")
    assert again.architecture == "conformer"
    assert again.config == loaded.config
    assert (again.feature_spec, again.decoding_defaults) == (loaded.feature_spec, loaded.decoding_defaults)
    assert again.tokenizer_spec.special_ids == loaded.tokenizer_spec.special_ids
    assert (again.tokenizer_root / again.tokenizer_spec.files["units"]).read_text() == \
        Path(loaded.tokenizer_spec.files["units"]).read_text()
    ref = refs["clip1"]
    hyps = [[int(t) for t in row if t >= 0] for row in ref["offline.prefix_nbest"]]
    outputs = []
    for model in (loaded.model, again.model):
        with torch.no_grad():
            hidden, lens = model.encode_offline(ref["fbank"][None], torch.tensor([ref["fbank"].size(0)]))
            chunked, _ = model.encoder.forward_chunk_by_chunk(ref["fbank"][None], torch.tensor([ref["fbank"].size(0)]), 4)
            outputs.append((model.ctc_log_probs(hidden), chunked, model.decoder.rescore(hidden, lens, [hyps])[0].scores))
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


def test_mfcc_features_map_to_kaldi_mfcc(wenet_copy):
    _edit_yaml(wenet_copy, lambda conf: conf["dataset_conf"].update(
        feats_type="mfcc", mfcc_conf={"num_mel_bins": 96, "num_ceps": 80, "frame_shift": 10, "frame_length": 25,
                                      "dither": 0.1, "high_freq": -400, "low_freq": 40}))
    spec = WenetConverter().convert(wenet_copy).features
    assert (spec.kind, spec.num_mel_bins, spec.num_ceps, spec.dither) == ("kaldi_mfcc", 96, 80, 0.0)
    assert (spec.low_freq, spec.high_freq, spec.audio_scale) == (40.0, -400.0, 32768.0)


def test_feature_bins_must_match_the_input_dim(wenet_copy):
    _edit_yaml(wenet_copy, _set("dataset_conf.fbank_conf.num_mel_bins", 40))
    with pytest.raises(CheckpointFormatError, match="num_mel_bins"):
        WenetConverter().convert(wenet_copy)
