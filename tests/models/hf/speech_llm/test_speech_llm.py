"""Qwen2-Audio (``speech_llm``) against transformers' ``Qwen2AudioForConditionalGeneration.generate(do_sample=False)``
on tiny random checkpoints (two shapes, built by transformers) and espeak-ng speech: frontend, tower, greedy and
beam ids, batching, stop tokens, prompts, key layouts, config defaults, the native bundle and int8."""

from __future__ import annotations

import json
import shutil

import attrs
import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.features import FeatureConfig, extract_features_batch

#: logit gap under which float32 noise could swap the greedy choice
MARGIN = 1e-3
STEPS = 16


def _features(processor, audio):
    return processor.feature_extractor(audio, sampling_rate=16000, return_attention_mask=True, padding="max_length",
                                       return_tensors="pt")


def _hf_prompt(processor, n_audio: int, instruction: str) -> torch.Tensor:
    text = "<|audio_bos|>" + "<|AUDIO|>" * n_audio + "<|audio_eos|>" + instruction
    return processor.tokenizer(text, return_tensors="pt").input_ids


def _hf_generate(hf, processor, audio, instruction, **kwargs):
    fe = _features(processor, audio)
    n = int(hf.model.audio_tower._get_feat_extract_output_lengths(fe.attention_mask.sum(-1))[1][0])
    ids = _hf_prompt(processor, n, instruction)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=fe.input_features.to(
            hf.dtype), feature_attention_mask=fe.attention_mask, do_sample=False, return_dict_in_generate=True,
            output_logits=True, **kwargs)
    return out.sequences[0, ids.shape[1]:].tolist(), out.logits, ids[0].tolist()


def _strip(ids, stops) -> list[int]:
    out = []
    for t in ids:
        if t in stops:
            break
        out.append(t)
    return out


def _engine(loaded, **kwargs) -> Engine:
    return Engine(EngineConfig(**kwargs), loaded=loaded)


@pytest.fixture(scope="module")
def hf64(llm_dir):
    from transformers import Qwen2AudioForConditionalGeneration

    return Qwen2AudioForConditionalGeneration.from_pretrained(llm_dir).double().eval()


@pytest.fixture(scope="module")
def ours64(llm_dir):
    return load_pretrained(llm_dir, dtype="float64")


# -- frontend, tower, loading -------------------------------------------------------------------------------
def test_frontend_equals_whisper_feature_extractor_128(ours, hf_llm, speech):
    _, processor = hf_llm
    assert processor.feature_extractor.feature_size == 128
    ref = _features(processor, speech)
    feats, lengths = extract_features_batch([torch.from_numpy(a) for a in speech], FeatureConfig.from_spec(ours.feature_spec))
    assert lengths.tolist() == ref.attention_mask.sum(-1).tolist()
    assert (feats - ref.input_features.transpose(1, 2)).abs().max() < 1e-5


def test_tower_and_projector_equal_transformers(ours, hf_llm, speech):
    hf, processor = hf_llm
    fe = _features(processor, speech)
    _, counts = hf.model.audio_tower._get_feat_extract_output_lengths(fe.attention_mask.sum(-1))
    with torch.no_grad():
        ours_audio, ours_counts = ours.model.encode_offline(fe.input_features.transpose(1, 2), fe.attention_mask.sum(-1))
        positions = (fe.attention_mask.sum(-1) - 1) // 2 + 1
        mask = torch.arange(1500)[None, :] < positions[:, None]
        from transformers.masking_utils import create_bidirectional_mask

        bidir = create_bidirectional_mask(config=hf.model.audio_tower.config, inputs_embeds=torch.zeros(len(speech), 1500, 1),
                                          attention_mask=mask.long())
        ref = hf.model.multi_modal_projector(hf.model.audio_tower(fe.input_features, attention_mask=bidir).last_hidden_state)
    assert ours_counts.tolist() == counts.tolist()
    for b, n in enumerate(counts.tolist()):
        err = (ours_audio[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()
        assert err < 1e-4, f"row {b}: relative error {err:.2e}"


def test_loads_by_detection_with_nothing_left_over(ours):
    assert ours.architecture == "speech_llm" and ours.decoding_defaults.decode_type == "llm"
    assert ours.load_report.missing == [] and ours.load_report.dropped == []


def test_prompt_ids_equal_the_hf_tokenizer(ours, hf_llm):
    _, processor = hf_llm
    strategy = _engine(ours).strategy
    for options in (DecodingOptions(), DecodingOptions(prompt="Generate the caption in English:"),
                    DecodingOptions(language="en")):
        instruction = strategy.instruction(options)
        assert strategy.prompt_ids(7, options) == _hf_prompt(processor, 7, instruction)[0].tolist()
    assert strategy.instruction(DecodingOptions()) == "Detect the language and recognize the speech:"
    assert strategy.instruction(DecodingOptions(language="en")).endswith(" <|en|>")


# -- generation ---------------------------------------------------------------------------------------------
def test_greedy_ids_equal_generate(ours, hf_llm, speech):
    hf, processor = hf_llm
    engine = _engine(ours, max_batch_size=1)
    instruction = engine.strategy.instruction(DecodingOptions())
    stops = set(ours.config.prompt.eos_token_ids)
    compared = total = 0
    for audio in speech:
        ref, logits, _ = _hf_generate(hf, processor, audio, instruction, max_new_tokens=STEPS)
        out = engine.transcribe_outputs(audio, decoding=DecodingOptions(max_new_tokens=STEPS))
        ref = _strip(ref, stops)
        safe = 0
        for step in logits[:len(ref)]:
            top = step[0].float().topk(2).values
            if float(top[0] - top[1]) < MARGIN:
                break
            safe += 1
        margins = [round(float(st[0].float().topk(2).values.diff().abs()), 5) for st in logits[:len(ref)]]
        assert out.tokens[:safe] == ref[:safe], f"ours {out.tokens} vs {ref}; step margins {margins}"
        if safe == len(ref):
            assert out.tokens == ref, f"ours {out.tokens} vs {ref}; step margins {margins}"
        compared += safe
        total += len(ref)
    assert len({t for t in ref}) > 3, "the random model repeats one token: nothing is tested"
    assert compared >= 0.8 * total, f"only {compared} of {total} steps were clear of near-ties"


@pytest.mark.parametrize("beam", [2, 4])
def test_beam_ids_equal_generate_float64(ours64, hf64, hf_llm, speech, beam):
    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=1)
    instruction = engine.strategy.instruction(DecodingOptions())
    for audio in speech:
        ref, _, _ = _hf_generate(hf64, processor, audio, instruction, max_new_tokens=STEPS, num_beams=beam)
        out = engine.transcribe_outputs(audio, decoding=DecodingOptions(max_new_tokens=STEPS, beam_size=beam))
        assert out.tokens == _strip(ref, set(ours64.config.prompt.eos_token_ids))


def test_n_best_equals_num_return_sequences(ours64, hf64, hf_llm, speech):
    from oasr.tokenizers import build_tokenizer

    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=1)
    tokenizer = build_tokenizer(ours64.tokenizer_spec, ours64.tokenizer_root)
    instruction = engine.strategy.instruction(DecodingOptions())
    stops = set(ours64.config.prompt.eos_token_ids)
    fe = _features(processor, speech[0])
    n = int(hf64.model.audio_tower._get_feat_extract_output_lengths(fe.attention_mask.sum(-1))[1][0])
    ids = _hf_prompt(processor, n, instruction)
    with torch.no_grad():
        seq = hf64.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=fe.input_features.double(),
                            feature_attention_mask=fe.attention_mask, do_sample=False, max_new_tokens=STEPS,
                            num_beams=3, num_return_sequences=3)
    expected = [tokenizer.decode(_strip(row[ids.shape[1]:].tolist(), stops)) for row in seq]
    out = engine.transcribe_outputs(speech[0], decoding=DecodingOptions(max_new_tokens=STEPS, beam_size=3, n_best=3))
    assert out.nbest == expected and out.text == expected[0] and len(set(expected)) == 3
    with pytest.raises(RequestError, match="n_best=3 needs beam_size"):
        engine.add_request(speech[0], decoding=DecodingOptions(n_best=3, beam_size=2))


@pytest.mark.parametrize("length_penalty,early_stopping", [(0.5, True), (2.0, False)])
def test_beam_options_equal_generate_float64(ours64, hf64, hf_llm, speech, length_penalty, early_stopping):
    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=1,
                     decode_options={"length_penalty": length_penalty, "early_stopping": early_stopping})
    instruction = engine.strategy.instruction(DecodingOptions())
    stops = set(ours64.config.prompt.eos_token_ids)
    free, _, _ = _hf_generate(hf64, processor, speech[0], instruction, max_new_tokens=STEPS)
    stop_ids = (*stops, free[2])  # a token the model emits early, so beams finish at different lengths
    engine.strategy.prompt = attrs.evolve(engine.strategy.prompt, eos_token_ids=stop_ids)
    for audio in speech:
        ref, _, _ = _hf_generate(hf64, processor, audio, instruction, max_new_tokens=STEPS, num_beams=3,
                                 length_penalty=length_penalty, early_stopping=early_stopping,
                                 eos_token_id=list(stop_ids))
        out = engine.transcribe_outputs(audio, decoding=DecodingOptions(max_new_tokens=STEPS, beam_size=3))
        assert out.tokens == _strip(ref, set(stop_ids))


def test_stop_tokens_end_generation_as_generate_does(ours64, hf64, hf_llm, speech):
    """A frequent token made a stop token: both stop on it (greedy and beam), and the text excludes it."""
    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=1)
    instruction = engine.strategy.instruction(DecodingOptions())
    free, _, _ = _hf_generate(hf64, processor, speech[0], instruction, max_new_tokens=STEPS)
    stop = free[3]
    stops = (*ours64.config.prompt.eos_token_ids, stop)
    engine.strategy.prompt = attrs.evolve(engine.strategy.prompt, eos_token_ids=stops)
    for beam in (1, 3):
        ref, _, _ = _hf_generate(hf64, processor, speech[0], instruction, max_new_tokens=STEPS, num_beams=beam,
                                 eos_token_id=list(stops))
        out = engine.transcribe_outputs(speech[0], decoding=DecodingOptions(max_new_tokens=STEPS, beam_size=beam))
        assert out.tokens == _strip(ref, set(stops))
        if beam == 1:
            assert stop in ref and len(out.tokens) < STEPS


def test_a_custom_prompt_and_a_language_reach_the_model(ours64, hf64, hf_llm, speech):
    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=1)
    stops = set(ours64.config.prompt.eos_token_ids)
    outs = []
    for options in (DecodingOptions(prompt="Generate the caption in English:", max_new_tokens=STEPS),
                    DecodingOptions(language="en", max_new_tokens=STEPS)):
        ref, _, _ = _hf_generate(hf64, processor, speech[2], engine.strategy.instruction(options), max_new_tokens=STEPS)
        out = engine.transcribe_outputs(speech[2], decoding=options)
        assert out.tokens == _strip(ref, stops)
        outs.append(out.tokens)
    assert outs[0] != outs[1]
    with pytest.raises(RequestError, match="language 'xx'"):
        engine.add_request(speech[0], decoding=DecodingOptions(language="xx"))


def test_generate_over_a_left_padded_batch_equals_ours_batched(ours64, hf64, hf_llm, speech):
    _, processor = hf_llm
    engine = _engine(ours64, max_batch_size=8, max_pad_ratio=100.0)
    instruction = engine.strategy.instruction(DecodingOptions())
    fe = _features(processor, speech)
    counts = hf64.model.audio_tower._get_feat_extract_output_lengths(fe.attention_mask.sum(-1))[1]
    prompts = [_hf_prompt(processor, int(n), instruction)[0] for n in counts]
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), ours64.config.prompt.eos_token_ids[0], dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, longest - len(p):], mask[r, longest - len(p):] = p, 1
    with torch.no_grad():
        seq = hf64.generate(input_ids=ids, attention_mask=mask, input_features=fe.input_features.double(),
                            feature_attention_mask=fe.attention_mask, do_sample=False, max_new_tokens=STEPS)
    rids = [engine.add_request(a, decoding=DecodingOptions(max_new_tokens=STEPS)) for a in speech]
    outputs = {o.request_id: o for o in engine.run()}
    stops = set(ours64.config.prompt.eos_token_ids)
    for r, rid in enumerate(rids):
        assert outputs[rid].tokens == _strip(seq[r, longest:].tolist(), stops)


def _counting_merge(lm, calls: list):
    original = type(lm).merge

    def merge(a, b):
        calls.append(1)
        return original(lm, a, b)

    return merge


def test_batched_different_lengths_equal_one_at_a_time(ours64, speech):
    requests = [DecodingOptions(max_new_tokens=STEPS), DecodingOptions(max_new_tokens=STEPS - 5, beam_size=3),
                DecodingOptions(max_new_tokens=STEPS, beam_size=2)]
    alone = [_engine(ours64, max_batch_size=1).transcribe_outputs(a, decoding=o) for a, o in zip(speech, requests,
                                                                                                 strict=True)]
    # every request at once; continuous batching through 4 LM rows (the third request joins the first, mid-decode,
    # when the second finishes); and through 3 (one request at a time)
    for rows in (32, 4, 3):
        engine = _engine(ours64, max_batch_size=8, max_pad_ratio=100.0, decode_options={"max_active_rows": rows})
        lm, merges = engine.strategy.lm, []
        lm.merge = _counting_merge(lm, merges)
        ids = [engine.add_request(a, decoding=o) for a, o in zip(speech, requests, strict=True)]
        outputs = {o.request_id: o for o in engine.run()}
        assert (len(merges) > 0) == (rows == 4), "a request must join the running batch mid-decode exactly at 4 rows"
        del lm.merge
        for rid, single in zip(ids, alone, strict=True):
            assert outputs[rid].tokens == single.tokens


def test_the_tower_refuses_more_than_its_30s_window(ours):
    from oasr.errors import CapabilityError

    feats = torch.zeros(1, 3002, ours.config.audio.num_mel_bins)
    with pytest.raises(CapabilityError, match="3000 log-mel frames"):
        ours.model.encode_offline(feats, torch.tensor([3002]))


# -- checkpoint layouts and config defaults -------------------------------------------------------------
def _copy_with_weights(src, dst, state, shards: int = 1):
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    keys = sorted(state)
    if shards == 1:
        save_file(state, str(dst / "model.safetensors"))
        return dst
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i::shards]}
        save_file(part, str(dst / name))
        weight_map.update({k: name for k in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _renamed(state, layout):
    out = {}
    for k, v in state.items():
        if layout == "5.x":
            k = ("model." + k.replace("language_model.model.", "language_model.", 1) if not k.startswith(
                "language_model.lm_head") else k.replace("language_model.lm_head", "lm_head", 1))
        elif layout == "5.x-resave":
            k = k.replace("language_model.model.", "language_model.model.model.", 1)
        out[k] = v.clone()
    return out


@pytest.mark.parametrize("layout,shards", [("5.x", 1), ("5.x-resave", 1), ("4.x", 3)])
def test_key_layouts_and_sharded_safetensors_load_the_same_model(llm_dir, ours, tmp_path, layout, shards):
    from safetensors.torch import load_file

    state = load_file(str(llm_dir / "model.safetensors"))
    assert any(k.startswith("language_model.model.") for k in state)  # transformers saves the 4.x layout
    other = load_pretrained(_copy_with_weights(llm_dir, tmp_path / layout, _renamed(state, layout), shards))
    assert other.load_report.missing == [] and other.load_report.dropped == []
    mine, theirs = ours.model.state_dict(), other.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_omitted_text_config_fields_take_qwen2_defaults(llm_dir, tmp_path):
    from transformers import AutoConfig

    dst = shutil.copytree(llm_dir, tmp_path / "sparse")
    raw = json.loads((dst / "config.json").read_text())
    for key in ("rms_norm_eps", "rope_parameters", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
                "head_dim", "hidden_act"):
        raw["text_config"].pop(key, None)
    (dst / "config.json").write_text(json.dumps(raw))
    ref = AutoConfig.from_pretrained(dst).text_config
    ours = load_pretrained(dst).config.text
    assert ours.rms_norm_eps == ref.rms_norm_eps
    assert ours.num_key_value_heads == ref.num_key_value_heads
    assert ours.rope_theta == ref.rope_parameters["rope_theta"] == 10000.0
    assert ours.max_position_embeddings == ref.max_position_embeddings == 32768


def test_native_bundle_round_trip_is_bit_identical(ours, speech, tmp_path):
    from oasr.checkpoints.native import load_native, save_native

    save_native(ours, tmp_path / "bundle")
    again = load_native(tmp_path / "bundle")
    mine, theirs = ours.model.state_dict(), again.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert again.config == ours.config
    options = DecodingOptions(max_new_tokens=8)
    assert _engine(again).transcribe_outputs(speech[1], decoding=options).tokens == \
        _engine(ours).transcribe_outputs(speech[1], decoding=options).tokens


def test_int8_goes_to_the_lm_through_the_waist(llm_dir, speech):
    loaded = load_pretrained(llm_dir)
    reference = load_pretrained(llm_dir)
    engine = _engine(loaded, quantization="int8")
    layers = loaded.quantization["layers"]
    assert layers and all(name.startswith("language_model.") for name in layers)
    assert "language_model.lm_head" in layers
    fe = extract_features_batch([torch.from_numpy(speech[0])], FeatureConfig.from_spec(loaded.feature_spec))
    with torch.no_grad():
        audio, counts = loaded.model.encode_offline(*fe)
        ids = torch.tensor([engine.strategy.prompt_ids(int(counts[0]), DecodingOptions())])
        probes = []
        for model in (loaded.model, reference.model):
            x = model.language_model.embed(ids)
            x[ids == loaded.config.prompt.audio_token_id] = audio[0, : int(counts[0])]
            probes.append(model.language_model.prefill(x)[1])
    err = (probes[0] - probes[1]).abs().max() / probes[1].abs().max()
    assert 0 < err < 0.15  # per-tensor uint8 activations (7 bits without VNNI) against fp32
    assert engine.transcribe_outputs(speech[0], decoding=DecodingOptions(max_new_tokens=4)).finish_reason == "stop"
