"""``.nemo`` archives built by NeMo itself (``save_to()``) against NeMo's ``transcribe()``: CTC, RNN-T, TDT and a
hybrid RNNT+CTC model, tiny and random (init widened so the tokens vary), on espeak-ng speech.

NeMo runs in its own venv (its pins clash with this one's): ``nemo_oracle.py`` builds each model, saves the
archive and writes NeMo's text, token ids, features and encoder output, which the tests compare with OASR
loading the archive.  A missing NeMo venv fails the tests (it is the oracle), it never skips them.  The
archive reader's safety rules are checked on archives made here with ``tarfile``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path

import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.engine import Engine, EngineConfig
from oasr.errors import CheckpointFormatError, UnsupportedConfigError
from oasr.features import FeatureConfig, extract_features_batch
from tests.helpers import nemo_python
from tests.models.hf.whisper import _helpers as wh

pytestmark = pytest.mark.reference

ORACLE = Path(__file__).with_name("nemo_oracle.py")
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back when you get this message.",
    "No.",
    "The weather today is sunny with a light breeze and the sea is calm.",
)
ARCHITECTURE = {"ctc": "nemo_ctc", "rnnt": "nemo_rnnt", "tdt": "nemo_tdt", "hybrid": "nemo_rnnt",
                "ctc_cache": "nemo_ctc_streaming", "rnnt_cache": "nemo_rnnt_streaming",
                "tdt_cache": "nemo_rnnt_streaming"}
CTC, TDT, CACHE_AWARE = ("ctc", "ctc_cache"), ("tdt", "tdt_cache"), ("ctc_cache", "rnnt_cache", "tdt_cache")
#: log-prob gap below which float32 noise of two implementations could swap a CTC frame's argmax
MARGIN = 1e-4


def espeak(text: str, out: Path):
    """espeak-ng speech at 16 kHz, reproducible: sox's conversion without its default random dither."""
    espeak_bin, sox_bin = shutil.which("espeak-ng"), shutil.which("sox")
    if espeak_bin is None or sox_bin is None:
        raise AssertionError("espeak-ng and sox are required (apt-get install -y espeak-ng sox)")
    raw = subprocess.run([espeak_bin, "-v", "en-us", "-s", "130", "--stdout", text], check=True,
                         capture_output=True).stdout
    subprocess.run([sox_bin, "-D", "-t", "wav", "-", "-r", "16000", "-c", "1", "-b", "16", str(out)], input=raw,
                   check=True, capture_output=True)
    return wh.read_wav(out)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> list[tuple[Path, object]]:
    out = tmp_path_factory.mktemp("nemo_espeak")
    return [(out / f"s{i}.wav", espeak(text, out / f"s{i}.wav")) for i, text in enumerate(SENTENCES)]


@pytest.fixture(scope="module")
def build(tmp_path_factory, speech):
    """``build(kind)``: (kind, archive path, NeMo's outputs) for one model kind, built by NeMo once per module."""
    cache: dict[str, tuple[str, Path, dict]] = {}

    def run(kind: str) -> tuple[str, Path, dict]:
        if kind not in cache:
            out = tmp_path_factory.mktemp(f"nemo_{kind}")
            env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
            proc = subprocess.run([str(nemo_python()), str(ORACLE), kind, str(out), *(str(p) for p, _ in speech)],
                                  capture_output=True, text=True, timeout=900, env=env, cwd=out)
            if proc.returncode != 0:
                raise AssertionError(f"NeMo oracle failed for {kind}:\n{proc.stderr[-4000:]}")
            cache[kind] = kind, out / "model.nemo", torch.load(out / "oracle.pt", weights_only=True)
        return cache[kind]

    return run


@pytest.fixture(scope="module")
def load(build):
    """``load(kind)``: the archive of ``build(kind)`` loaded by OASR, once per module."""
    cache = {}

    def run(kind: str):
        if kind not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no unexplained unused tensor
                cache[kind] = load_pretrained(build(kind)[1])
        return cache[kind]

    return run


@pytest.fixture(params=sorted(ARCHITECTURE))
def kind(request) -> str:
    """Every archive kind, for the tests that hold for all of them."""
    return request.param


@pytest.fixture
def built(build, kind):
    return build(kind)


@pytest.fixture
def loaded(load, kind):
    return load(kind)


def _features(model, audios):
    return extract_features_batch([torch.from_numpy(a) for a in audios], FeatureConfig.from_spec(model.feature_spec))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_loads_by_detection_with_the_heads_config(built, loaded):
    kind, _, ref = built
    assert loaded.architecture == ARCHITECTURE[kind]
    assert loaded.load_report.missing == []
    allowed = ("num_batches_tracked", "preprocessor.featurizer.", "ctc_decoder.")
    assert all(k.endswith(allowed[0]) or k.startswith(allowed[1:]) for k in loaded.load_report.dropped)
    # the blank follows the SentencePiece vocabulary
    assert loaded.config.vocab_size == ref["vocab_size"] + 1 and loaded.config.blank_id == ref["vocab_size"]
    assert loaded.feature_spec.kind == "nemotron_logmel"
    assert loaded.feature_spec.normalize == (None if kind in CACHE_AWARE else "per_feature")
    assert loaded.feature_spec.options["n_fft"] == 512 and loaded.feature_spec.dither == 0.0
    decode = loaded.decoding_defaults
    assert decode.decode_type == ("ctc" if kind in CTC else "transducer") and decode.blank_id == ref["vocab_size"]
    if kind not in CTC:
        assert decode.options["max_symbols"] == 3  # the archive's decoding.greedy.max_symbols
        assert loaded.model.joiner.durations == ((0, 1, 2, 3, 4) if kind in TDT else ())
        # the hybrid's joint is 48 wide over a 40-wide predictor (joint_hidden != pred_hidden)
        assert loaded.config.joint_hidden_size == (48 if kind == "hybrid" else None)
        assert loaded.model.joiner.head.weight.shape[1] == (48 if kind == "hybrid" else 40)


def test_frontend_equals_nemo_preprocessor(built, loaded, speech):
    _, _, ref = built
    for (_, audio), expected in zip(speech, ref["feats"], strict=True):
        feats, lengths = _features(loaded, [audio])
        assert int(lengths[0]) == expected.shape[0]
        torch.testing.assert_close(feats[0, : expected.shape[0]], expected, rtol=0, atol=1e-4)


def test_encoder_within_1e4_relative(built, loaded, speech):
    _, _, ref = built
    for (_, audio), feats, expected in zip(speech, ref["feats"], ref["encoder"], strict=True):
        with torch.no_grad():
            hidden, lengths = loaded.model.encode_offline(feats[None], torch.tensor([feats.shape[0]]))
            ours, our_lengths = loaded.model.encode_offline(*_features(loaded, [audio]))
        assert int(lengths[0]) == int(our_lengths[0]) == expected.shape[0]
        assert _relative(hidden[0], expected) < 1e-4  # NeMo's features through our encoder
        assert _relative(ours[0], expected) < 1e-4  # and our features too


def _rnnt_replay(loaded, audio) -> tuple[list[int], list[tuple[int, float]]]:
    """Greedy RNN-T (max_symbols a frame) over our model: the labels and, per decision, (labels so far, the
    top-2 log-prob gap)."""
    model, max_symbols = loaded.model, loaded.decoding_defaults.options["max_symbols"]
    with torch.no_grad():
        hidden, _ = model.encode_offline(*_features(loaded, [audio]))
        enc = model.joiner.project_encoder(hidden[0])
        state = model.predictor.init_state(1, torch.device("cpu"))
        t, symbols, labels, decisions = 0, 0, [], []
        while t < enc.shape[0]:
            pred = model.joiner.project_predictor(model.predictor.predict(state))[0]
            top = model.joiner.joint(enc[t], pred).log_softmax(-1).topk(2)
            decisions.append((len(labels), float(top.values[0] - top.values[1])))
            token = int(top.indices[0])
            if token != model.predictor.blank_id:
                labels.append(token)
                state = model.predictor.advance(state, torch.tensor([token]), torch.tensor([True]))
                symbols += 1
            if token == model.predictor.blank_id or symbols >= max_symbols:
                t, symbols = t + 1, 0
    return labels, decisions


def _near_tie_divergence(loaded, audio, ours: list[int], ids: list[int]) -> bool:
    """True when our RNN-T labels leave NeMo's at a decision whose top-2 gap is float noise."""
    labels, decisions = _rnnt_replay(loaded, audio)
    assert labels == ours, "the engine's greedy labels differ from a plain greedy loop over the same model"
    k = next((i for i, (a, b) in enumerate(zip(ours, ids, strict=False)) if a != b), min(len(ours), len(ids)))
    # the decisions after our label k - 1 up to the one emitting our label k (or the end)
    gaps = [gap for emitted, gap in decisions if max(k - 1, 0) <= emitted <= k]
    return bool(gaps) and min(gaps) < MARGIN


def _check_transcripts(outputs, texts, tokens, logprobs, loaded=None, audios=None) -> None:
    clips = 0
    for i, (out, text, ids, lp) in enumerate(zip(outputs, texts, tokens, logprobs, strict=True)):
        if lp is not None:  # CTC: a frame whose top-2 gap is float noise may legitimately differ
            top = lp.topk(2, dim=-1).values
            if not bool((top[:, 0] - top[:, 1] > MARGIN).all()):
                continue
        elif out.tokens != ids and loaded is not None and not loaded.model.joiner.durations:
            if _near_tie_divergence(loaded, audios[i], out.tokens, ids):
                continue  # RNN-T: the labels part at a near-tie (checked: not a clear decision)
        assert out.tokens == ids, f"token ids differ from NeMo's for {text!r}"
        assert out.text == text
        clips += 1
    assert clips >= len(texts) - 1, "too few clips were clear of near-ties to compare"
    distinct = {t for ids in tokens for t in ids}
    assert len(distinct) > 3, "the random model emits too few distinct tokens to test anything"


def test_text_and_token_ids_equal_nemo_transcribe(built, loaded, speech):
    _, _, ref = built
    audios = [a for _, a in speech]
    outputs = Engine(EngineConfig(max_batch_size=1), loaded=loaded).transcribe_outputs(audios)
    _check_transcripts(outputs, ref["texts"], ref["tokens"], ref["logprobs"], loaded, audios)


def test_batched_equals_alone(built, loaded, speech):
    audios = [a for _, a in speech]
    alone = Engine(EngineConfig(max_batch_size=1), loaded=loaded).transcribe_outputs(audios)
    batched = Engine(EngineConfig(max_batch_size=4, max_pad_ratio=10.0), loaded=loaded).transcribe_outputs(audios)
    assert [o.tokens for o in alone] == [o.tokens for o in batched]


#: NeMo's decoding.strategy -> our TDT search (the transducer option ``search``)
STRATEGIES = {"beam": "default", "maes": "maes"}


def _tdt_nbest(loaded, enc: torch.Tensor, beam: int, search: str = "default") -> list:
    from oasr.decoding.tdt_search import tdt_beam_rows

    model = loaded.model
    with torch.no_grad():
        proj = model.joiner.project_encoder(enc[None])
        rows = tdt_beam_rows(model.predictor, model.joiner, 1, "cpu", blank_id=loaded.decoding_defaults.blank_id,
                             beam_size=beam, search=search)
        for t in range(proj.shape[1]):
            rows.step(proj[:, t], [0])
    return rows.results(0)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("kind", TDT)
def test_tdt_beam_search_equals_nemo_beam_tdt_infer_on_its_encoder_output(built, loaded, strategy):
    """Every kept hypothesis of NeMo's ``decoding.strategy`` beam / maes (labels in order, scores), our search over
    the archive's predictor and joint fed NeMo's own encoder output; near-ties (an n-best that moves when the
    joint's head moves by 1e-6 relative, far above the float noise of the same computation) are not compared."""
    from tests.decoding._tdt_beam_oracle import nbest_mismatch, perturbed_head

    _, _, ref = built
    compared, search = 0, STRATEGIES[strategy]
    for enc, theirs in zip(ref["encoder"], ref[f"{strategy}_nbest"], strict=True):
        ours = _tdt_nbest(loaded, enc, ref["beam_size"], search)
        shaken = []
        for seed in (1, 2):
            with perturbed_head(loaded.model.joiner, seed):
                shaken.append([h.tokens for h in _tdt_nbest(loaded, enc, ref["beam_size"], search)])
        if any(other != [h.tokens for h in ours] for other in shaken):
            continue
        assert nbest_mismatch(ours, theirs) is None, nbest_mismatch(ours, theirs)
        compared += 1
    assert compared >= len(ref[f"{strategy}_nbest"]) - 1, "too few clips were clear of near-ties to compare"
    assert sum(len(n) > 1 for n in ref[f"{strategy}_nbest"]) >= 3 and ref[f"{strategy}_tokens"] != ref["tokens"]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("kind", TDT)
def test_tdt_beam_through_the_engine_equals_nemo_transcribe(built, loaded, speech, strategy):
    """``beam_size=4`` on the TDT archive (``search="maes"`` for NeMo's maes): the best ids and text equal
    ``transcribe()`` with NeMo's beam / maes strategy, the n-best texts NeMo's n-best (clips whose results move
    under a perturbation of the joint's encoder projection as large as the two encoders' difference excepted)."""
    from oasr.engine.options import DecodingOptions
    from tests.decoding._tdt_beam_oracle import perturbed_head

    _, _, ref = built
    audios = [a for _, a in speech]
    options = DecodingOptions(beam_size=ref["beam_size"], n_best=ref["beam_size"])
    # our encoder's frames are NeMo's within 1e-4 relative (test_encoder_within_1e4_relative): a clip whose
    # results move when the joint's encoder projection moves that much hinges on a near-tie
    engine = Engine(EngineConfig(max_batch_size=1, decode_options={"search": "maes"} if strategy == "maes" else {}),
                    loaded=loaded)

    def run():
        return [(o.tokens, o.text, o.nbest) for o in engine.transcribe_outputs(audios, decoding=options)]

    outputs = run()
    shaken = []
    for seed in (1, 2):
        with perturbed_head(loaded.model.joiner, seed, scale=1e-4, layer=0):
            shaken.append(run())
    compared = 0
    for i, (tokens, text, nbest) in enumerate(outputs):
        if any(other[i] != outputs[i] for other in shaken):
            continue
        assert tokens == ref[f"{strategy}_tokens"][i], f"best ids differ from NeMo's {strategy} for clip {i}"
        assert text == ref[f"{strategy}_texts"][i]
        assert nbest == [h["text"] for h in ref[f"{strategy}_nbest"][i]][: ref["beam_size"]]
        compared += 1
    assert compared >= len(audios) - 1, "too few clips were clear of near-ties to compare"


def _with_section(archive: Path, out: Path, section: str, **changes) -> Path:
    """A copy of ``archive`` at ``out`` whose model_config.yaml has ``changes`` in its ``section``."""
    import yaml

    with tarfile.open(archive) as tar:
        member = next(m for m in tar if m.name.endswith("model_config.yaml"))
        config = yaml.safe_load(tar.extractfile(member).read())
    changed = dict(config, **{section: dict(config[section], **changes)})
    return _repacked(archive, out, {"model_config.yaml": yaml.safe_dump(changed).encode()})


def test_a_tdt_archive_decoding_with_beam_makes_the_beam_search_the_default(build, speech, tmp_path):
    from oasr.engine.options import DecodingOptions

    _, archive, _ = build("tdt")
    beam = load_pretrained(_with_section(archive, tmp_path / "beam.nemo", "decoding", strategy="beam",
                                          beam={"beam_size": 3, "return_best_hypothesis": True}))
    assert beam.decoding_defaults.options["search"] == "modified_beam"
    assert beam.decoding_defaults.options["beam_size"] == 3
    audios = [a for _, a in speech]
    default = Engine(EngineConfig(max_batch_size=1), loaded=beam).transcribe_outputs(audios)
    asked = Engine(EngineConfig(max_batch_size=1), loaded=load_pretrained(archive)).transcribe_outputs(
        audios, decoding=DecodingOptions(beam_size=3))
    greedy = Engine(EngineConfig(max_batch_size=1), loaded=load_pretrained(archive)).transcribe_outputs(audios)
    assert [o.tokens for o in default] == [o.tokens for o in asked] != [o.tokens for o in greedy]
    maes = load_pretrained(_with_section(archive, tmp_path / "maes.nemo", "decoding", strategy="maes", beam={"beam_size": 2}))
    assert (maes.decoding_defaults.options["search"], maes.decoding_defaults.options["beam_size"]) == ("maes", 2)
    with pytest.raises(UnsupportedConfigError, match="decoding.beam.maes_num_steps=3"):
        load_pretrained(_with_section(archive, tmp_path / "steps.nemo", "decoding", strategy="maes",
                                       beam={"beam_size": 2, "maes_num_steps": 3}))
    with pytest.raises(UnsupportedConfigError, match="decoding.beam.score_norm=False"):
        load_pretrained(_with_section(archive, tmp_path / "norm.nemo", "decoding", strategy="beam",
                                       beam={"beam_size": 4, "score_norm": False}))


def test_hybrid_ctc_head_by_architecture_equals_nemo_ctc_decoding(build, speech):
    _, archive, ref = build("hybrid")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ctc = load_pretrained(archive, architecture="nemo_ctc")
    assert ctc.architecture == "nemo_ctc" and ctc.decoding_defaults.decode_type == "ctc"
    outputs = Engine(EngineConfig(max_batch_size=1), loaded=ctc).transcribe_outputs([a for _, a in speech])
    _check_transcripts(outputs, ref["ctc_texts"], ref["ctc_tokens"], ref["ctc_logprobs"])


# -- the archive reader's safety rules and refusals -------------------------------------------------------------
def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = (tarfile.LNKTYPE if hard else tarfile.SYMTYPE), target
    return info, None


@pytest.mark.parametrize("member", [
    _file("../evil.txt", b"x"), _file("/etc/evil.txt", b"x"), _file("./a/../../evil.txt", b"x"),
    _link("tokenizer.model", "/etc/passwd"), _link("tokenizer.model", "../../outside"),
    _link("tokenizer.model", "../outside", hard=True),
], ids=["dotdot", "absolute", "nested-dotdot", "symlink-absolute", "symlink-up", "hardlink-up"])
def test_members_leading_outside_are_refused(tmp_path, member):
    path = _archive(tmp_path / "bad.nemo", [_file("model_config.yaml", b"encoder: {}\n"), member])
    with pytest.raises(CheckpointFormatError, match="outside the archive") as info:
        load_pretrained(path)
    assert str(path) in str(info.value)


def test_a_device_member_is_refused(tmp_path):
    info = tarfile.TarInfo("dev")
    info.type = tarfile.CHRTYPE
    path = _archive(tmp_path / "dev.nemo", [_file("model_config.yaml", b"encoder: {}\n"), (info, None)])
    with pytest.raises(CheckpointFormatError, match="device or FIFO"):
        load_pretrained(path)


def test_oversized_members_are_refused(built, tmp_path, monkeypatch):
    from oasr_models_hf.fastconformer import nemo

    _, archive, _ = built
    copy = tmp_path / "copy.nemo"
    copy.write_bytes(archive.read_bytes())
    monkeypatch.setattr(nemo, "MAX_SMALL_BYTES", 100)  # the config is larger
    with pytest.raises(CheckpointFormatError, match="byte limit"):
        load_pretrained(copy)


def _repacked(archive: Path, out: Path, replace: dict[str, bytes]) -> Path:
    """``archive`` with the members named in ``replace`` (by base name) given new contents."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None
            base = Path(member.name).name
            if base in replace:
                data = replace[base]
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out


def test_weights_needing_arbitrary_unpickling_are_refused(built, tmp_path):
    import argparse

    _, archive, _ = built
    buffer = io.BytesIO()
    torch.save({"encoder.x": torch.zeros(1), "obj": argparse.Namespace(a=1)}, buffer)  # a class: not plain data
    bad = _repacked(archive, tmp_path / "pickled.nemo", {"model_weights.ckpt": buffer.getvalue()})
    with pytest.raises(CheckpointFormatError, match="not a plain tensor state dict"):
        load_pretrained(bad)


#: (archive kind, encoder key, value, the key the refusal names): on a full-context archive a limited context or
#: causal subsampling makes it cache-aware, and then every cache-aware rule must hold; the other archives share
#: these rules
ENCODER_REFUSALS = (
    ("ctc", "att_context_size", [[70, 13], [70, 1]], "causal_downsampling"),
    ("ctc", "causal_downsampling", True, "att_context_style"),
    ("ctc", "conv_context_size", "causal", "conv_context_size"),
    ("ctc", "subsampling", "striding", "subsampling"),
    ("ctc", "self_attention_model", "abs_pos", "self_attention_model"),
    ("rnnt", "att_context_size", [70, 13], "causal_downsampling"),
    ("rnnt", "conv_norm_type", "group_norm", "conv_norm_type"),
    ("rnnt_cache", "att_context_size", [-1, 6], "att_context_size"),
    ("rnnt_cache", "conv_context_size", [4, 4], "conv_context_size"),
    ("rnnt_cache", "conv_norm_type", "batch_norm", "conv_norm_type"),
)


@pytest.mark.parametrize(("kind", "key", "value", "named"), ENCODER_REFUSALS)
def test_what_the_encoders_do_not_compute_is_refused_by_name(build, tmp_path, kind, key, value, named):
    _, archive, _ = build(kind)
    bad = _with_section(archive, tmp_path / f"{key}.nemo", "encoder", **{key: value})
    with pytest.raises(UnsupportedConfigError, match=f"encoder.{named}="):
        load_pretrained(bad)


def test_a_file_that_is_not_a_tar_archive_is_named(tmp_path):
    path = tmp_path / "broken.nemo"
    path.write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(CheckpointFormatError, match="not a readable .nemo archive"):
        load_pretrained(path)


def test_other_single_files_are_still_refused(tmp_path):
    path = tmp_path / "weights.pt"
    path.write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointFormatError, match="is a file; pass the checkpoint directory"):
        load_pretrained(path)


@pytest.mark.parametrize("kind", CACHE_AWARE)
def test_cache_aware_archives_stream_as_they_decode_offline(kind, loaded, speech):
    """A cache-aware archive streamed at its trained chunk gives its offline ids (offline: NeMo's, tested
    above), greedily and, for TDT, with beam search too."""
    from oasr.engine.options import DecodingOptions

    audios = [a for _, a in speech]
    offline = Engine(EngineConfig(max_batch_size=1), loaded=loaded)
    streaming = Engine(EngineConfig(service_mode="streaming"), loaded=loaded)
    for options in [DecodingOptions()] + ([DecodingOptions(beam_size=4, n_best=2)] if kind in TDT else []):
        want = offline.transcribe_outputs(audios, decoding=options)
        got = streaming.transcribe_outputs(audios, decoding=options, streaming=True)
        assert sum(len(o.tokens) for o in want) > 10
        for a, b in zip(want, got, strict=True):
            assert a.error is None and b.error is None
            assert (a.tokens, a.text, a.nbest) == (b.tokens, b.text, b.nbest)


def test_the_cache_aware_mask_is_applied_offline(build, load):
    import attrs

    _, _, ref = build("rnnt_cache")
    loaded = load("rnnt_cache")
    # att_context_size [14, 6]: 15-frame windows (the frame and 14 left), chunks of 7
    assert (loaded.config.sliding_window, loaded.config.num_lookahead_tokens) == (15, 6)
    # the same weights with one chunk over every clip (full attention) are far from NeMo's output
    config = attrs.evolve(loaded.config, sliding_window=129, num_lookahead_tokens=63)
    unmasked = type(loaded.model).from_config(config)
    unmasked.load_state_dict(loaded.model.state_dict())
    unmasked.eval()
    feats, expected = ref["feats"][-1], ref["encoder"][-1]
    assert expected.shape[0] > 2 * 15
    with torch.no_grad():
        hidden, _ = unmasked.encode_offline(feats[None], torch.tensor([feats.shape[0]]))
    assert _relative(hidden[0], expected) > 1e-2
