"""SenseVoice-Small against FunASR's ``SenseVoiceSmall``, on tiny random models FunASR builds.

Encoder output (over the four query embeddings and the features) and CTC log-probs are compared on
the same features; token ids, text and the language / emotion / event tags end to end against
``AutoModel.generate`` (whose text carries the tags inline: OASR takes them out into
``RequestOutput.language`` and ``RequestOutput.tags``).
"""

from __future__ import annotations

import re

import pytest
import torch

import oasr
from oasr.engine import DecodingOptions
from oasr.errors import RequestError
from oasr_models_funasr.sensevoice import LANGUAGE_QUERIES, TAG_CLASSES, TEXT_NORM_QUERIES
from tests.models.funasr import _helpers as h

TOL = 1e-4
MARGIN = 1e-3
SHAPES = ("small", "deep")
TAG = re.compile(r"<\|([^|]+)\|>")
CLASS_OF = {name: cls for cls, names in TAG_CLASSES.items() for name in names}


def _reference_pass(ref, audio, language: str = "auto", itn: bool = False):
    """FunASR's own pieces of ``SenseVoiceSmall.inference`` for one clip."""
    from funasr.utils.load_utils import extract_fbank

    model = ref.model
    feats, lens = extract_fbank([torch.from_numpy(audio)], data_type="sound", frontend=ref.kwargs["frontend"])
    with torch.no_grad():
        lang = model.embed(torch.LongTensor([[model.lid_dict[language]]]))
        norm = model.embed(torch.LongTensor([[model.textnorm_dict["withitn" if itn else "woitn"]]]))
        speech = torch.cat((lang, model.embed(torch.LongTensor([[1, 2]])), norm, feats), dim=1)
        hidden, hidden_lens = model.encoder(speech, lens + 4)
        log_probs = model.ctc.log_softmax(hidden)
    cmvn = ref.kwargs["frontend"].cmvn
    return feats / cmvn[1] - cmvn[0], lens, hidden, hidden_lens, log_probs


@pytest.fixture(scope="module")
def engines(sensevoice_dirs):
    return {shape: oasr.Engine(oasr.EngineConfig(model=str(path))) for shape, path in sensevoice_dirs.items()}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("language", ["auto", "en", "zh"])
def test_encoder_and_ctc_match_funasr_on_the_same_features(shape, language, engines, sensevoice_refs, clips):
    model = engines[shape].model
    for _, audio in clips:
        raw, lens, hidden_ref, hidden_lens, log_probs_ref = _reference_pass(sensevoice_refs[shape], audio, language)
        with torch.inference_mode():
            hidden, out_lens = model.encode_offline(raw, lens, torch.tensor([LANGUAGE_QUERIES[language]]),
                                                    TEXT_NORM_QUERIES["woitn"])
            log_probs = model.ctc_log_probs(hidden)
        assert int(out_lens[0]) == int(hidden_lens[0]) == int(lens[0]) + 4
        assert h.rel_err(hidden, hidden_ref) < TOL
        assert h.rel_err(log_probs, log_probs_ref) < TOL


def _split(text: str) -> tuple[str, dict[str, str]]:
    tags: dict[str, str] = {}
    for name in TAG.findall(text):
        tags.setdefault(CLASS_OF[name], name)
    return " ".join(TAG.sub("", text).split()), tags


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("language", "itn"), [(None, False), ("en", True)])
def test_tokens_text_and_tags_equal_funasr_generate(shape, language, itn, sensevoice_dirs, sensevoice_refs, clips):
    engine = oasr.Engine(oasr.EngineConfig(model=str(sensevoice_dirs[shape]), decode_options={"use_itn": itn}))
    options = DecodingOptions(language=language)
    ours = engine.transcribe_outputs([a for _, a in clips], decoding=options)
    tag_ids = {i for i in range(engine.tokenizer.vocab_size) if TAG.fullmatch(engine.tokenizer.id_to_piece(i))}
    frames_total = frames_clear = whole = 0
    for row, (name, audio) in enumerate(clips):
        *_, lens, log_probs = _reference_pass(sensevoice_refs[shape], audio, language or "auto", itn)
        frames = log_probs[0, :int(lens[0]) + 4]
        feats, feat_lens = oasr.features.extract_features_batch([torch.from_numpy(audio)], engine.feature_config)
        with torch.inference_mode():
            hidden, _ = engine.model.encode_offline(feats, feat_lens, torch.tensor([LANGUAGE_QUERIES[language or "auto"]]),
                                                    TEXT_NORM_QUERIES["withitn" if itn else "woitn"])
            mine = engine.model.ctc_log_probs(hidden)[0].argmax(-1)
        clear = h.margins(frames) >= MARGIN
        assert torch.equal(mine[clear], frames.argmax(-1)[clear]), name
        frames_total += frames.shape[0]
        frames_clear += int(clear.sum())
        if not bool(clear.all()):
            continue
        ids = [t for t in torch.unique_consecutive(frames.argmax(-1)).tolist() if t != 0]
        (theirs,) = h.generate(sensevoice_refs[shape], [audio], language=language or "auto", use_itn=itn)
        text, tags = _split(theirs["text"])
        assert ours[row].tokens == [t for t in ids if t not in tag_ids], name
        assert " ".join(ours[row].text.split()) == text, name
        assert ours[row].language == tags.pop("language", None), name
        assert (ours[row].tags or {}) == tags, name
        whole += 1
    assert frames_clear >= 0.95 * frames_total, f"only {frames_clear} of {frames_total} frames free of near-ties"
    assert whole >= 2, f"only {whole} of {len(clips)} clips were free of near-ties"
    assert any(o.tags for o in ours), "no clip carried a tag: the test would not see a tag bug"


def test_batched_equals_one_at_a_time(engines, clips):
    engine = engines["deep"]
    waves = [a for _, a in clips]
    batched = engine.transcribe_outputs(waves)
    alone = [engine.transcribe_outputs(w) for w in waves]
    assert [(o.tokens, o.text, o.language, o.tags) for o in batched] == \
        [(o.tokens, o.text, o.language, o.tags) for o in alone]


def test_unknown_language_is_refused_at_admission(engines, clips):
    with pytest.raises(RequestError, match="no language query 'fr'.*auto, zh, en"):
        engines["small"].add_request(clips[0][1], decoding=DecodingOptions(language="fr"))


def test_detected_and_round_trips(sensevoice_dirs, tmp_path, clips):
    from oasr.checkpoints.convert import convert

    loaded = oasr.load_pretrained(sensevoice_dirs["small"])
    assert loaded.architecture == "sensevoice"
    again = oasr.load_pretrained(convert(str(sensevoice_dirs["small"]), tmp_path / "bundle"))
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key
    first = oasr.Engine(oasr.EngineConfig(model=str(sensevoice_dirs["small"])), loaded=loaded)
    second = oasr.Engine(oasr.EngineConfig(model=str(tmp_path / "bundle")), loaded=again)
    waves = [a for _, a in clips[:2]]
    assert [(o.text, o.tags) for o in first.transcribe_outputs(waves)] == \
        [(o.text, o.tags) for o in second.transcribe_outputs(waves)]


def test_long_audio_is_refused(sensevoice_dirs, clips):
    engine = oasr.Engine(oasr.EngineConfig(model=str(sensevoice_dirs["small"]), decode_options={"max_audio_seconds": 3}))
    short, long = clips[1][1], clips[-1][1]
    assert len(short) / 16000 < 3 < len(long) / 16000
    outputs = engine.transcribe_outputs([short, long])
    assert outputs[0].finish_reason == "stop"
    assert outputs[1].finish_reason == "error" and "longer than the 3 s SenseVoice decodes" in outputs[1].error
