"""Nemotron ASR offline (``nemotron_asr_streaming``, ``nemotron3_5_asr``) against transformers'
``NemotronAsrStreamingForRNNT`` / ``Nemotron3_5AsrForRNNT`` + their processors on tiny random checkpoints built
by transformers and espeak-ng speech: loading, frontend, encoder under the trained chunked_limited mask (dense and
in query blocks), greedy transducer ids and text equal ``generate()``, batching, and per-request language prompts."""

from __future__ import annotations

import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.errors import RequestError
from oasr.features import FeatureConfig, extract_features_batch
from tests.models.hf.nemotron.conftest import PROMPTS, load_hf

pytestmark = pytest.mark.reference

#: joint logit gap below which float32 noise (frontend 5e-5, encoder 1e-6) could swap a greedy step's argmax
MARGIN = 1e-3


def _features(loaded, audios):
    return extract_features_batch([torch.from_numpy(a) for a in audios], FeatureConfig.from_spec(loaded.feature_spec))


def _generate(hf, processor, audio, language=None):
    """transformers' greedy ids (blank/pad dropped) and text for one clip; ``language`` for 3.5's processor."""
    kwargs = {} if language is None else {"language": language}
    inputs = processor(audio, sampling_rate=16000, return_tensors="pt", **kwargs)
    with torch.no_grad():
        seq = hf.generate(**inputs, max_new_tokens=4096)
    seq = seq.sequences if hasattr(seq, "sequences") else seq
    blank = hf.config.blank_token_id
    return [int(i) for i in seq[0] if int(i) != blank], processor.batch_decode(seq, skip_special_tokens=True)[0]


def _greedy_margin(model, hidden: torch.Tensor, max_symbols: int) -> tuple[list[int], float]:
    """Our greedy search replayed on one row's hidden (T, D): its tokens and the smallest top-2 joint gap."""
    pred, joint = model.predictor, model.joiner
    enc = joint.project_encoder(hidden)
    state = pred.init_state(1, hidden.device)
    tokens, margin = [], float("inf")
    with torch.no_grad():
        for t in range(enc.shape[0]):
            for _ in range(max_symbols):
                logits = joint.joint(enc[t], joint.project_predictor(pred.predict(state))[0])
                top = logits.topk(2).values
                margin = min(margin, float(top[0] - top[1]))
                best = int(logits.argmax())
                if best == pred.blank_id:
                    break
                tokens.append(best)
                state = pred.advance(state, torch.tensor([best]), torch.tensor([True]))
    return tokens, margin


@pytest.fixture(scope="module")
def pair(any_dir):
    return load_pretrained(any_dir), *load_hf(any_dir)


# -- loading and frontend ----------------------------------------------------------------------------------------
def test_loads_by_detection_with_nothing_left_over(pair, any_dir):
    ours, hf, processor = pair
    assert ours.architecture == hf.config.model_type
    assert ours.load_report.missing == [] and ours.load_report.dropped == []
    assert ours.config.blank_id == hf.config.blank_token_id
    assert ours.config.num_lookahead_tokens == processor.default_num_lookahead_tokens == 1
    assert ours.config.sliding_window == hf.config.encoder_config.sliding_window
    assert ours.decoding_defaults.decode_type == "transducer"
    assert ours.decoding_defaults.options["max_symbols"] == hf.config.max_symbols_per_step
    assert ours.feature_spec.kind == "nemotron_logmel" and ours.feature_spec.normalize is None
    if ours.architecture == "nemotron3_5_asr":
        assert ours.config.prompt_dictionary == PROMPTS
        assert ours.config.default_prompt_id == hf.config.default_prompt_id


def test_frontend_equals_the_feature_extractor(pair, speech):
    ours, _, processor = pair
    ref = processor.feature_extractor(speech, sampling_rate=16000, return_tensors="pt")
    feats, lengths = _features(ours, speech)
    assert lengths.tolist() == ref.attention_mask.sum(-1).tolist()
    torch.testing.assert_close(feats, ref.input_features[:, :feats.shape[1]], rtol=0, atol=5e-5)


# -- encoder -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [64, 2, 4])
def test_encoder_within_1e4_relative_dense_and_in_query_blocks(pair, speech, block, monkeypatch):
    ours, hf, processor = pair
    monkeypatch.setattr(ours.model.encoder, "offline_block_frames", block)
    inputs = processor(speech, sampling_rate=16000, return_tensors="pt")
    lookahead = processor.default_num_lookahead_tokens
    with torch.no_grad():
        ref = hf.encoder(input_features=inputs.input_features, attention_mask=inputs.attention_mask,
                         num_lookahead_tokens=lookahead).last_hidden_state
        hidden, lengths = ours.model.encoder(inputs.input_features, inputs.attention_mask.sum(-1))
    expected = hf._get_subsampling_output_length(inputs.attention_mask.sum(-1))
    assert lengths.tolist() == expected.tolist()
    if block < 64:  # the blocked form really ran: the longest clip spans many blocks
        assert hidden.shape[1] > 2 * (block + ours.model.encoder.left_chunks * 2)
    for b, n in enumerate(lengths.tolist()):
        err = (hidden[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()
        assert err < 1e-4, f"row {b} batched: relative error {err:.2e}"
        alone = processor(speech[b], sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            ref_alone = hf.encoder(input_features=alone.input_features, attention_mask=alone.attention_mask,
                                   num_lookahead_tokens=lookahead).last_hidden_state[0]
            mine, _ = ours.model.encoder(alone.input_features, alone.attention_mask.sum(-1))
        err = (mine[0, :n] - ref_alone[:n]).abs().max() / ref_alone[:n].abs().max()
        assert err < 1e-4, f"row {b} alone: relative error {err:.2e}"


def test_the_trained_mask_is_load_bearing(pair, speech, monkeypatch):
    """Full attention (the mask dropped) is far from transformers: the chunked_limited rule is really applied."""
    ours, hf, processor = pair
    inputs = processor(speech[3], sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        ref = hf.encoder(input_features=inputs.input_features, attention_mask=inputs.attention_mask,
                         num_lookahead_tokens=1).last_hidden_state
        monkeypatch.setattr(ours.model.config, "sliding_window", 10_000)
        monkeypatch.setattr(ours.model.config, "num_lookahead_tokens", 10_000)
        hidden, _ = ours.model.encoder(inputs.input_features, inputs.attention_mask.sum(-1))
    assert float((hidden - ref).abs().max() / ref.abs().max()) > 1e-2


# -- greedy transducer ---------------------------------------------------------------------------------------------
def test_ids_and_text_equal_generate(pair, speech):
    ours, hf, processor = pair
    outputs = Engine(EngineConfig(max_batch_size=1), loaded=ours).transcribe_outputs(list(speech))
    compared = 0
    distinct = set()
    for audio, out in zip(speech, outputs, strict=True):
        ids, text = _generate(hf, processor, audio)
        feats, lengths = _features(ours, [audio])
        with torch.no_grad():
            hidden, n = ours.model.encode_offline(feats, lengths)
        replay, margin = _greedy_margin(ours.model, hidden[0, :int(n[0])], ours.config.max_symbols_per_step)
        assert out.tokens == replay, "the engine's greedy search is not the plain greedy search"
        distinct |= set(ids)
        if margin > MARGIN:  # no step near a tie: ids and text must be transformers'
            assert out.tokens == ids
            assert out.text == text
            compared += 1
    assert len(distinct) > 5, "the random model emits too few distinct tokens to test anything"
    assert compared >= len(speech) - 1


def test_batched_equals_one_at_a_time(pair, speech):
    ours = pair[0]
    alone = Engine(EngineConfig(max_batch_size=1), loaded=ours).transcribe_outputs(list(speech))
    batched = Engine(EngineConfig(max_batch_size=8, max_pad_ratio=10.0), loaded=ours).transcribe_outputs(
        list(speech))
    assert sum(len(a.tokens) for a in alone) > 10
    for a, b in zip(alone, batched, strict=True):
        assert a.tokens == b.tokens and a.text == b.text


# -- language prompts ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def v35(v35_dir):
    return load_pretrained(v35_dir), *load_hf(v35_dir)


def test_prompt_table_resolution(v35):
    config = v35[0].config
    assert config.prompt_id("en") == 0          # listed as a code
    assert config.prompt_id("zh") == 4          # its xx-XX spelling
    assert config.prompt_id("vi") == 2          # the one slot its locales share
    assert config.prompt_id("en-US") == 0
    with pytest.raises(ValueError, match="not in this checkpoint's prompt table"):
        config.prompt_id("de")


def _run(engine, clips, languages):
    ids = [engine.add_request(audio, decoding=DecodingOptions(language=lang))
           for audio, lang in zip(clips, languages, strict=True)]
    done = {out.request_id: out for out in engine.run()}
    return [done[i] for i in ids]


def test_two_languages_in_one_batch_each_equal_transformers_with_that_prompt(v35, speech, monkeypatch):
    ours, hf, processor = v35
    engine = Engine(EngineConfig(max_batch_size=8, max_pad_ratio=10.0), loaded=ours)
    calls = []
    plain = ours.model.encode_offline

    def recording(feats, feat_lens, prompt_ids=None):
        calls.append(None if prompt_ids is None else prompt_ids.tolist())
        return plain(feats, feat_lens, prompt_ids=prompt_ids)

    monkeypatch.setattr(ours.model, "encode_offline", recording)
    clips = [speech[0], speech[3], speech[0], speech[3], speech[1]]
    languages = ["en", "zh", "zh", "en", None]
    outs = _run(engine, clips, languages)
    monkeypatch.setattr(ours.model, "encode_offline", plain)
    assert len(calls) == 1 and sorted(calls[0]) == sorted([0, 4, 4, 0, PROMPTS["auto"]]), calls
    tokens = {}
    for audio, lang, out in zip(clips, languages, outs, strict=True):
        # transformers' processor looks the table up verbatim: hand it the entry ours resolved to
        ids, text = _generate(hf, processor, audio, language={"en": "en", "zh": "zh-ZH", None: "auto"}[lang])
        feats, lengths = _features(ours, [audio])
        prompt = torch.tensor([ours.model.resolve_prompt(lang)])
        with torch.no_grad():
            hidden, n = ours.model.encode_offline(feats, lengths, prompt_ids=prompt)
        replay, margin = _greedy_margin(ours.model, hidden[0, :int(n[0])], ours.config.max_symbols_per_step)
        assert out.tokens == replay
        assert margin > MARGIN, f"a near tie ({margin:.1e}) on {lang}: pick other clips"
        assert out.tokens == ids and out.text == text
        tokens[(len(audio), lang)] = out.tokens
    # the prompt really changes the output, so a batch ignoring per-row prompts would fail above
    assert tokens[(len(speech[0]), "en")] != tokens[(len(speech[0]), "zh")]
    assert tokens[(len(speech[3]), "en")] != tokens[(len(speech[3]), "zh")]


def test_no_language_takes_the_plain_call_with_the_default_prompt(v35, speech, monkeypatch):
    ours, hf, processor = v35
    engine = Engine(EngineConfig(max_batch_size=8), loaded=ours)
    calls = []
    plain = ours.model.encode_offline
    monkeypatch.setattr(ours.model, "encode_offline",
                        lambda f, n, **kw: calls.append(kw) or plain(f, n, **kw))
    out = _run(engine, [speech[1]], [None])[0]
    monkeypatch.setattr(ours.model, "encode_offline", plain)
    assert calls == [{}]
    assert out.tokens == _generate(hf, processor, speech[1])[0]  # the processor's default: "auto"


def test_an_unknown_language_is_refused_at_admission_and_the_others_decode(v35, speech):
    ours = v35[0]
    engine = Engine(EngineConfig(max_batch_size=8), loaded=ours)
    kept = engine.add_request(speech[1], decoding=DecodingOptions(language="en"))
    with pytest.raises(RequestError, match="prompt table") as err:
        engine.add_request(speech[0], decoding=DecodingOptions(language="de"))
    assert err.value.param == "language"
    outs = engine.run()
    assert [o.request_id for o in outs] == [kept] and outs[0].error is None and outs[0].tokens


def test_a_model_without_prompts_refuses_a_language(stream_dir, speech):
    engine = Engine(EngineConfig(), loaded=load_pretrained(stream_dir))
    with pytest.raises(RequestError, match="language"):
        engine.add_request(speech[0], decoding=DecodingOptions(language="en"))


def test_native_bundle_round_trip_keeps_the_folded_prompt_table(v35, speech, tmp_path):
    from oasr.checkpoints.native import load_native, save_native

    ours = v35[0]
    save_native(ours, tmp_path / "bundle")
    again = load_native(tmp_path / "bundle")
    assert again.config == ours.config
    feats, lengths = _features(again, speech[:2])
    prompt = torch.tensor([4, 0])
    with torch.no_grad():
        a, _ = ours.model.encode_offline(feats, lengths, prompt_ids=prompt)
        b, _ = again.model.encode_offline(feats, lengths, prompt_ids=prompt)
    assert torch.equal(a, b)


def test_offline_attention_memory_grows_with_t_not_t_squared(stream_dir):
    """The blocked layout's position table is fixed and its scores are linear in T (a dense T x T would not)."""
    from oasr_models_hf.fastconformer.nemotron_encoder import AttentionLayout

    encoder = load_pretrained(stream_dir).model.encoder
    chunk, left = encoder.attention_chunk, encoder.left_chunks
    sizes = {}
    for frames in (1000, 4000):
        layout = AttentionLayout(frames, torch.tensor([frames]), chunk, left, 64, 32, torch.float32)
        sizes[frames] = (layout.table.shape[0], layout.mask.numel())
        assert layout.queries == 64 and layout.history == left * chunk
    assert sizes[1000][0] == sizes[4000][0] == 2 * 64 + left * chunk - 1
    assert sizes[4000][1] <= 4.1 * sizes[1000][1] < 4000 * 4000


@pytest.mark.parametrize("streaming", [False, True])
def test_audio_shorter_than_a_frame_decodes_without_error(stream_dir, speech, streaming):
    import numpy as np

    kw = dict(service_mode="streaming", chunk_size=4) if streaming else {}
    engine = Engine(EngineConfig(model=str(stream_dir), **kw))
    outs = engine.transcribe_outputs([np.zeros(100, dtype=np.float32), np.zeros(1000, dtype=np.float32), speech[2]],
                                     streaming=streaming)
    assert all(o.error is None and o.finish_reason == "stop" for o in outs)
    assert outs[2].tokens
