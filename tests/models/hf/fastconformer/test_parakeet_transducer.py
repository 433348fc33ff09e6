"""Parakeet RNN-T and TDT (``parakeet_rnnt``, ``parakeet_tdt``) against transformers' ``ParakeetForRNNT`` /
``ParakeetForTDT`` ``generate()`` on tiny random checkpoints (two encoder shapes each, built by transformers,
blank calibrated so labels and blanks mix) and espeak-ng speech, decoded by the core ``transducer`` family:
encoder projection, label ids, their frames (TDT: the predicted durations), text, batching, the predictor
contract and the refusal of beam search on a recurrent predictor."""

from __future__ import annotations

import contextlib

import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.decoding.transducer import transducer_greedy_search
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.features import FeatureConfig, extract_features_batch
from oasr.models.transducer import TransducerJoiner, TransducerPredictor

pytestmark = pytest.mark.reference

#: logit gap below which two implementations' float32 noise could swap a decision
MARGIN = 1e-4


@pytest.fixture(scope="session")
def hf_transducer(transducer_dir):
    import transformers as tf

    kind = tf.AutoConfig.from_pretrained(transducer_dir).model_type
    cls = tf.ParakeetForRNNT if kind == "parakeet_rnnt" else tf.ParakeetForTDT
    return cls.from_pretrained(transducer_dir).eval(), tf.AutoProcessor.from_pretrained(transducer_dir)


@pytest.fixture(scope="session")
def ours(transducer_dir):
    return load_pretrained(transducer_dir)


def _labels_within_the_limit(seq, starts, blank: int, max_symbols: int) -> tuple[list[tuple[int, int]], bool]:
    """The (label, frame) steps of a generated path, cut after the ``max_symbols``-th label at one frame when
    the path stays there: transformers' TDT ``generate()`` has no per-frame limit, NeMo's (and ours) moves on
    to the next frame.  Also whether the path was cut."""
    labels: list[tuple[int, int]] = []
    for i, (token, frame) in enumerate(zip(seq, starts, strict=True)):
        if token == blank:
            continue
        labels.append((token, frame))
        at_frame = sum(1 for _, f in labels if f == frame)
        if at_frame == max_symbols and i + 1 < len(seq) and starts[i + 1] == frame:
            return labels, True
    return labels, False


@pytest.fixture(scope="session")
def reference(hf_transducer, speech):
    """transformers' ``generate()`` per clip alone (the first three): (labels, their frames, text, whether the
    path was cut at transformers' missing TDT label limit)."""
    hf, processor = hf_transducer
    blank, limit = hf.config.blank_token_id, hf.config.max_symbols_per_step
    out = []
    for audio in speech[:3]:
        inputs = processor(audio, sampling_rate=16000, return_tensors="pt")
        frames = int(hf.encoder._get_subsampling_output_length(inputs.attention_mask.sum(-1))[0])
        with torch.no_grad():
            gen = hf.generate(**inputs, max_new_tokens=(limit + 1) * frames + 2)
        seq, durations = gen.sequences[0].tolist(), gen.durations[0]
        starts = (durations.cumsum(0) - durations).tolist()  # the frame each step decided at
        labels, cut = _labels_within_the_limit(seq[1:], [int(f) for f in starts[1:]], blank, limit)
        out.append(([t for t, _ in labels], [f for _, f in labels],
                    processor.batch_decode(gen.sequences, skip_special_tokens=True)[0], cut))
    return out


class RecordingJoiner:
    """The model's joiner, recording the smallest top-2 gap of every decision (labels, and durations)."""

    def __init__(self, joiner):
        self.inner = joiner
        self.durations = joiner.durations
        self.project_encoder = joiner.project_encoder
        self.project_predictor = joiner.project_predictor
        self.smallest = float("inf")

    def joint(self, enc_proj, pred_proj):
        logits = self.inner.joint(enc_proj, pred_proj)
        vocab = logits.shape[-1] - len(self.durations)
        for part in (logits[..., :vocab], logits[..., vocab:]):
            if part.shape[-1] > 1:
                top = part.float().topk(2, dim=-1).values
                self.smallest = min(self.smallest, float((top[..., 0] - top[..., 1]).min()))
        return logits


def _features(loaded, audios):
    return extract_features_batch([torch.from_numpy(a) for a in audios], FeatureConfig.from_spec(loaded.feature_spec))


def _our_search(loaded, audio):
    """Our greedy search of one clip with the decisions' smallest margin."""
    model = loaded.model
    joiner = RecordingJoiner(model.joiner)
    feats, lengths = _features(loaded, [audio])
    with torch.no_grad():
        hidden, out_lens = model.encode_offline(feats, lengths)
        hyp = transducer_greedy_search(model.predictor, joiner, joiner.project_encoder(hidden), out_lens,
                                       blank_id=model.config.blank_id,
                                       max_symbols=loaded.decoding_defaults.options["max_symbols"])[0]
    return hyp, joiner.smallest


# -- loading ----------------------------------------------------------------------------------------------------
def test_loads_by_detection_with_the_contract(ours, hf_transducer):
    hf, _ = hf_transducer
    assert ours.architecture == hf.config.model_type
    assert ours.load_report.missing == []
    assert all(k.endswith("num_batches_tracked") for k in ours.load_report.dropped)
    assert ours.decoding_defaults.decode_type == "transducer"
    assert ours.decoding_defaults.blank_id == hf.config.blank_token_id == ours.config.blank_id
    assert ours.decoding_defaults.options["max_symbols"] == hf.config.max_symbols_per_step
    model = ours.model
    assert isinstance(model.predictor, TransducerPredictor) and isinstance(model.joiner, TransducerJoiner)
    assert model.predictor.label_window_state is False
    assert model.joiner.durations == tuple(getattr(hf.config, "durations", ()))


def test_encoder_projection_within_1e4_relative(ours, hf_transducer, speech):
    hf, processor = hf_transducer
    inputs = processor(speech, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        ref = hf.get_audio_features(input_features=inputs.input_features,
                                    attention_mask=inputs.attention_mask).pooler_output
        hidden, lengths = ours.model.encode_offline(inputs.input_features, inputs.attention_mask.sum(-1))
        mine = ours.model.joiner.project_encoder(hidden)
    for b, n in enumerate(lengths.tolist()):
        err = (mine[b, :n] - ref[b, :n]).abs().max() / ref[b, :n].abs().max()
        assert err < 1e-4, f"row {b}: relative error {err:.2e}"


# -- decoding ---------------------------------------------------------------------------------------------------
def test_label_ids_frames_and_text_equal_generate(ours, reference, speech):
    engine = Engine(EngineConfig(max_batch_size=1), loaded=ours)
    outputs = engine.transcribe_outputs(list(speech[:3]))
    assert len({t for labels, *_ in reference for t in labels}) > 6, "too few distinct labels to test anything"
    clear = whole = 0
    for (labels, frames, text, cut), out, audio in zip(reference, outputs, speech[:3], strict=True):
        hyp, smallest = _our_search(ours, audio)
        assert out.tokens == hyp.tokens, "the engine's transducer strategy is not the plain greedy search"
        assert labels, "the random model emits nothing on this clip"
        if smallest > MARGIN:  # every decision clear of float noise: the paths must be equal
            n = len(labels) if cut else len(hyp.tokens)
            assert hyp.tokens[:n] == labels
            assert hyp.token_frames[:n] == frames
            if not cut:
                assert out.text == text
                whole += 1
            clear += 1
    assert clear >= len(reference) - 1, "too many clips hinge on near-ties to compare"
    assert whole >= 1, "no clip was compared whole"


def test_token_times_follow_the_frames(ours, speech):
    out = Engine(EngineConfig(), loaded=ours).transcribe_outputs(speech[1],
                                                                decoding=DecodingOptions(word_timestamps=True))
    hyp, _ = _our_search(ours, speech[1])
    frame = ours.model.encoder.subsampling_rate * 0.01
    times = {round(f * frame, 3) for f in hyp.token_frames}
    assert out.words and [w.word for w in out.words] == out.text.split()
    assert all(round(w.start, 3) in times for w in out.words), "a word starts where no label was emitted"
    starts = [w.start for w in out.words]
    assert starts == sorted(starts) and all(0.0 < w.confidence <= 1.0 for w in out.words)


def test_batched_equals_one_at_a_time(ours, speech):
    alone = Engine(EngineConfig(max_batch_size=1), loaded=ours).transcribe_outputs(list(speech))
    batched = Engine(EngineConfig(max_batch_size=8, max_pad_ratio=10.0), loaded=ours).transcribe_outputs(
        list(speech))
    assert any(a.tokens for a in alone)
    for a, b in zip(alone, batched, strict=True):
        assert a.tokens == b.tokens and a.text == b.text


def test_rnnt_beam_search_is_refused_naming_the_recurrent_predictor(ours, speech):
    if ours.model.joiner.durations:
        return  # a TDT joint has NeMo's TDT beam search (test_tdt_beam_search_equals_nemo_beam_tdt_infer)
    out = Engine(EngineConfig(), loaded=ours).transcribe_outputs(speech[2], decoding=DecodingOptions(beam_size=4))
    assert out.error and "recurrent" in out.error and out.text == ""


@contextlib.contextmanager
def _zero_blank_embedding(predictor):
    """NeMo's prediction network starts from a zero input (its blank is the embedding's zero padding row, as
    in every NeMo-trained checkpoint); a random transformers embedding has a non-zero blank row."""
    saved = predictor.embedding.weight.detach().clone()
    with torch.no_grad():
        predictor.embedding.weight[predictor.blank_id].zero_()
    try:
        yield
    finally:
        with torch.no_grad():
            predictor.embedding.weight.copy_(saved)


def _nemo_spec(model, encoder: list[torch.Tensor], beam: int) -> dict:
    from tests.decoding._tdt_beam_oracle import lstm_joint_spec

    lstm, joint = model.predictor.lstm, model.joiner
    layers = [tuple(getattr(lstm, f"{name}_l{i}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
              for i in range(lstm.num_layers)]
    spec = lstm_joint_spec(model.predictor.embedding.weight, layers,
                           (joint.encoder_projector.weight, joint.encoder_projector.bias),
                           (joint.decoder_projector.weight, joint.decoder_projector.bias),
                           (joint.head.weight, joint.head.bias), activation=model.config.joint_act,
                           durations=joint.durations, encoder=encoder)
    return dict(spec, runs=[["default", beam]])


def test_tdt_beam_search_equals_nemo_beam_tdt_infer(ours, speech, tmp_path):
    """``beam_size=4, n_best=4`` through the engine on ``parakeet_tdt``: the n-best (labels in order) and best
    text equal NeMo's ``BeamTDTInfer`` (``decoding.strategy="beam"``) over NeMo's own prediction and joint
    networks holding this checkpoint's weights, fed this checkpoint's encoder output (equal to transformers'
    within 1e-4, tested above); clips whose n-best moves under a perturbation of the joint's head (far above
    float noise) are near-ties and not compared."""
    from tests.decoding._tdt_beam_oracle import perturbed_head, run_nemo_tdt_beam

    model = ours.model
    if not model.joiner.durations:
        return  # RNN-T: beam search is refused (test_rnnt_beam_search_is_refused_naming_the_recurrent_predictor)
    beam = 4
    options = DecodingOptions(beam_size=beam, n_best=beam)
    engine = Engine(EngineConfig(max_batch_size=1), loaded=ours)
    with _zero_blank_embedding(model.predictor), torch.no_grad():
        encoder = []
        for audio in speech:
            hidden, lengths = model.encode_offline(*_features(ours, [audio]))
            encoder.append(hidden[0, : int(lengths[0])])
        theirs = run_nemo_tdt_beam({"hf": _nemo_spec(model, encoder, beam)}, tmp_path)["hf"][f"default/{beam}"]
        outputs = engine.transcribe_outputs(list(speech), decoding=options)
        shaken = []
        for seed in (1, 2):
            with perturbed_head(model.joiner, seed):
                shaken.append([o.nbest for o in engine.transcribe_outputs(list(speech), decoding=options)])
    tokenizer = engine.tokenizer
    compared = 0
    for i, (out, nbest) in enumerate(zip(outputs, theirs, strict=True)):
        assert out.error is None and out.nbest and len(out.nbest) <= beam
        if any(other[i] != out.nbest for other in shaken):
            continue
        assert out.tokens == nbest[0]["tokens"], f"clip {i}: best labels differ from NeMo's beam"
        assert out.nbest == [tokenizer.decode(h["tokens"]) for h in nbest][:beam]
        compared += 1
    assert compared >= len(speech) - 1, "too few clips were clear of near-ties to compare"
    assert sum(len(n) > 1 for n in theirs) >= 2 and sum(len(n[0]["tokens"]) for n in theirs) >= 10


# -- the predictor contract ---------------------------------------------------------------------------------------
def test_predictor_rows_are_independent(ours):
    predictor = ours.model.predictor
    torch.manual_seed(0)
    with torch.no_grad():
        state = predictor.init_state(3, torch.device("cpu"))
        assert torch.equal(predictor.predict(state)[0], predictor.predict(state)[2])
        tokens = torch.tensor([5, 9, 11])
        both = predictor.advance(state, tokens, torch.tensor([True, False, True]))
        assert torch.equal(predictor.predict(both)[1], predictor.predict(state)[1])
        for row in (0, 2):
            alone = predictor.advance(predictor.select(state, torch.tensor([row])), tokens[row:row + 1],
                                      torch.tensor([True]))
            torch.testing.assert_close(predictor.predict(alone)[0], predictor.predict(both)[row], rtol=0, atol=1e-6)
        rows = predictor.unstack_states(both)
        restacked = predictor.stack_states(rows)
        assert all(torch.equal(a, b) for a, b in zip(restacked, both, strict=True))
        picked = predictor.select(both, torch.tensor([2, 2, 0]))
        assert torch.equal(predictor.predict(picked)[0], predictor.predict(both)[2])
