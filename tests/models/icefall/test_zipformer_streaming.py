"""Causal Zipformer streaming against icefall's own ``decode_one_chunk`` loop (the fixtures' ``stream.*``).

The fixtures were streamed at chunk 16 / left context 64 embed frames: ``chunk_size=16``,
``num_left_chunks=4`` here (EngineConfig.chunk_size is icefall's ``--chunk-size``, in embed frames).
icefall's loop: features padded with 13 + 30 LOG_EPS frames, 45-frame windows at stride 32 while
any padded frame is left, a short last window padded with LOG_EPS; 8 encoder frames per chunk.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

import oasr
from oasr.engine import DecodingOptions, Engine, EngineConfig
from oasr.engine.backends import SlotBackend, StatefulBackend
from oasr.errors import CapabilityError
from oasr_models_icefall.release import load_state_dict
from oasr_models_icefall.zipformer.convert import infer_zipformer_config
from oasr_models_icefall.zipformer.encoder import ZipformerEncoderModel

from .conftest import CAUSAL, CLIPS, TRANSDUCERS, clip_path, refs, release_dir, results

LOG_EPS = math.log(1e-10)
CHUNK, LEFT_CHUNKS = 16, 4
WINDOW, STRIDE = 2 * CHUNK + 13, 2 * CHUNK


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def icefall_windows(fbank: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """icefall's DecodeStream: (window zero-padded to 45 frames, valid frames) per chunk."""
    padded = torch.cat([fbank, torch.full((13 + 30, fbank.shape[1]), LOG_EPS)])
    out = []
    for start in range(0, padded.shape[0], STRIDE):
        window = padded[start: start + WINDOW]
        n = window.shape[0]
        out.append((torch.cat([window, window.new_zeros(WINDOW - n, window.shape[1])]), n))
    return out


@pytest.fixture(scope="module")
def encoders(fixtures_dir):
    """Each causal fixture's encoder, its config inferred from the release's shapes, loaded strictly."""
    out = {}
    for name in CAUSAL:
        state = load_state_dict(release_dir(fixtures_dir, name))
        encoder = ZipformerEncoderModel(infer_zipformer_config(state))
        encoder.load_state_dict({k: v for k, v in state.items() if k.startswith(("encoder.", "encoder_embed."))})
        out[name] = encoder.eval()
    return out


@pytest.fixture(scope="module")
def fixture_refs(fixtures_dir):
    return {name: refs(fixtures_dir, name) for name in CAUSAL}


def streaming_engine(fixtures_dir, name, **kw) -> Engine:
    architecture = "transducer" if name in TRANSDUCERS else None
    config = EngineConfig(model=str(release_dir(fixtures_dir, name)), architecture=architecture,
                          service_mode="streaming", chunk_size=CHUNK, num_left_chunks=LEFT_CHUNKS, **kw)
    return Engine(config)


# -- declarations ------------------------------------------------------------------------------------------
def test_geometry_kind_and_state_specs(encoders):
    encoder = encoders["zipformer_ctc_causal"]
    assert encoder.streaming_kind == "slot"
    geometry = encoder.streaming_geometry(16)
    assert (geometry.chunk_size, geometry.window_frames, geometry.stride_frames) == (8, 45, 32)
    encoder.prepare_streaming(16, -1)  # the release geometry: left context 128 embed frames
    specs = {s.name: s for s in encoder.streaming_state_specs}
    assert len(specs) == 6 * 7 + 2  # six caches for each of the 7 layers, the embed pad, the counter
    assert specs["layer0.cached_key"].shape == (128, 1, 32) and specs["layer0.cached_key"].slot_axis == 1
    assert specs["layer4.cached_key"].shape == (128 // 8, 1, 32)  # layer 4 is stack 3's, at 1/8 the rate
    assert specs["layer0.cached_nonlin_attn"].shape == (1, 1, 128, 24)
    assert specs["layer0.cached_conv1"].shape == (1, 32, 15) and specs["layer0.cached_conv1"].slot_axis == 0
    assert specs["embed.cached_left_pad"].shape == (1, 128, 3, 19)
    assert specs["processed_lens"].dtype == "int64"
    encoder.prepare_streaming(16, 4)
    assert {s.name: s for s in encoder.streaming_state_specs}["layer0.cached_key"].shape == (64, 1, 32)
    for chunk, left in ((12, -1), (16, 0)):
        with pytest.raises(CapabilityError, match="zipformer streaming needs"):
            encoder.prepare_streaming(chunk, left)
    with pytest.raises(CapabilityError, match="window of 40 feature frames gives 13 embed frames"):
        encoder.forward_chunk_stateful(torch.zeros(1, 40, 80), encoder.init_stream_state(1))


def test_the_engine_defaults_to_the_release_geometry(fixtures_dir):
    """EngineConfig's defaults (chunk_size 16, num_left_chunks -1) are icefall's release geometry."""
    engine = Engine(EngineConfig(model=str(release_dir(fixtures_dir, "zipformer_ctc_causal")),
                                 service_mode="streaming", max_streams=3))
    states = engine._streaming.backend.states
    assert states["layer0.cached_key"].shape == (128, 3, 32)
    assert states["processed_lens"].shape == (3,) and states["processed_lens"].dtype == torch.int64
    assert engine._streaming.geometry.window_frames == 45 and engine._streaming.geometry.stride_frames == 32
    with pytest.raises(CapabilityError, match="chunk_size .* multiple of 8"):
        Engine(EngineConfig(model=str(release_dir(fixtures_dir, "zipformer_ctc_causal")), service_mode="streaming",
                            chunk_size=12))


def test_a_non_causal_checkpoint_is_refused_in_streaming_mode(fixtures_dir):
    path = release_dir(fixtures_dir, "zipformer_ctc")
    assert oasr.load_pretrained(path).model.encoder.streaming_kind == "none"
    with pytest.raises(CapabilityError, match="cannot stream.*service_mode='offline'"):
        Engine(EngineConfig(model=str(path), service_mode="streaming"))


# -- the chunk step ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CAUSAL)
def test_the_stateful_list_api_equals_icefalls_chunks(encoders, fixture_refs, fixtures_dir, name):
    encoder = encoders[name]
    encoder.prepare_streaming(CHUNK, LEFT_CHUNKS)
    for clip in CLIPS:
        ref = fixture_refs[name][clip]
        windows = icefall_windows(ref["fbank"])
        assert len(windows) == len(results(fixtures_dir, name)["clips"][clip]["stream"]["chunks"])
        state = encoder.init_stream_state(1)
        outs = []
        with torch.inference_mode():
            for i, (window, n) in enumerate(windows):
                hidden, lens, state = encoder.forward_chunk_stateful(window[None], state,
                                                                     feat_lens=torch.tensor([n]))
                assert int(lens[0]) == CHUNK // 2
                assert rel(hidden[0], ref[f"stream.chunk{i:03d}_out"]) < 1e-4
                outs.append(hidden[0])
        assert rel(torch.cat(outs), ref["stream.encoder_out"]) < 1e-4
        assert int(state[-1][0]) == CHUNK * len(windows)  # the processed-length counter


@pytest.mark.parametrize("name", CAUSAL)
def test_the_slot_backend_batches_both_clips_like_icefall(fixtures_dir, fixture_refs, name):
    """Both clips in one cohort (clip0 ends first), from the fixture's features through the pool."""
    engine = streaming_engine(fixtures_dir, name)
    backend = engine._streaming.backend
    assert isinstance(backend, SlotBackend)
    assert backend.states["layer0.cached_key"].shape == (64, engine.config.max_streams, 32)
    streams = [SimpleNamespace(slot=slot, options=DecodingOptions()) for slot in (3, 0)]
    for stream in streams:
        backend.allocate(stream)
    windows = [icefall_windows(fixture_refs[name][clip]["fbank"]) for clip in CLIPS]
    outs: list[list[torch.Tensor]] = [[], []]
    with torch.inference_mode():
        for step in range(max(len(w) for w in windows)):
            rows = [r for r in range(2) if step < len(windows[r])]
            feats = torch.stack([windows[r][step][0] for r in rows])
            lens = torch.tensor([windows[r][step][1] for r in rows])
            hidden, lengths = backend.forward([streams[r] for r in rows], feats, lens, torch.zeros(len(rows)))
            for i, r in enumerate(rows):
                outs[r].append(hidden[i, : int(lengths[i])])
    for r, clip in enumerate(CLIPS):
        assert rel(torch.cat(outs[r]), fixture_refs[name][clip]["stream.encoder_out"]) < 1e-4


def test_stacked_list_states_run_both_clips_as_a_batch(encoders, fixture_refs):
    """icefall's stack_states / unstack_states: two streams' lists batched for a chunk and split back."""
    encoder = encoders["zipformer_transducer_causal"]
    encoder.prepare_streaming(CHUNK, LEFT_CHUNKS)
    refs_ = [fixture_refs["zipformer_transducer_causal"][clip] for clip in CLIPS]
    windows = [icefall_windows(r["fbank"]) for r in refs_]
    states = [encoder.init_stream_state(1) for _ in CLIPS]
    outs: list[list[torch.Tensor]] = [[], []]
    with torch.inference_mode():
        for step in range(max(len(w) for w in windows)):
            rows = [r for r in range(2) if step < len(windows[r])]
            batch = encoder.stack_streaming_states([states[r] for r in rows])
            feats = torch.stack([windows[r][step][0] for r in rows])
            lens = torch.tensor([windows[r][step][1] for r in rows])
            hidden, _, batch = encoder.forward_chunk_stateful(feats, batch, feat_lens=lens)
            for i, (r, state) in enumerate(zip(rows, encoder.unstack_streaming_states(batch), strict=True)):
                states[r] = state
                outs[r].append(hidden[i])
    for r, ref in enumerate(refs_):
        assert rel(torch.cat(outs[r]), ref["stream.encoder_out"]) < 1e-4
        assert [t.shape for t in states[r]] == [t.shape for t in encoder.init_stream_state(1)]


def test_the_stateful_backend_runs_the_same_encoder(fixtures_dir, fixture_refs):
    engine = streaming_engine(fixtures_dir, "zipformer_ctc_causal")
    backend = StatefulBackend(engine.model, max_streams=2, chunk_size=CHUNK, num_left_chunks=LEFT_CHUNKS,
                              max_chunks=100, dtype=torch.float32, device=torch.device("cpu"),
                              lock=engine._streaming.lock)
    stream = SimpleNamespace(slot=0, options=DecodingOptions())
    backend.allocate(stream)
    ref = fixture_refs["zipformer_ctc_causal"]["clip1"]
    outs = []
    with torch.inference_mode():
        for window, n in icefall_windows(ref["fbank"]):
            hidden, lengths = backend.forward([stream], window[None], torch.tensor([n]), torch.zeros(1))
            outs.append(hidden[0, : int(lengths[0])])
    assert rel(torch.cat(outs), ref["stream.encoder_out"]) < 1e-4


def stream_stateful(encoder, fbank: torch.Tensor) -> torch.Tensor:
    state = encoder.init_stream_state(1)
    outs = []
    with torch.inference_mode():
        for window, n in icefall_windows(fbank):
            hidden, _, state = encoder.forward_chunk_stateful(window[None], state, feat_lens=torch.tensor([n]))
            outs.append(hidden[0])
    return torch.cat(outs)


def test_the_release_left_context_streams_like_the_offline_chunk_mask(encoders, fixture_refs):
    """num_left_chunks -1 is the release geometry (left context 128 embed frames): the stream equals the
    offline pass under icefall's chunk mask at 16 / 128 on every chunk that does not touch the end of
    the utterance, and differs from the fixture's left 64 once the history passes 64 frames."""
    encoder = encoders["zipformer_ctc_causal"]
    fbank = fixture_refs["zipformer_ctc_causal"]["clip1"]["fbank"]
    encoder.prepare_streaming(CHUNK, -1)
    assert encoder.stream_left_context == 128
    streamed = stream_stateful(encoder, fbank)
    with torch.inference_mode():
        offline, lens = encoder(fbank[None], torch.tensor([fbank.shape[0]]), chunk_size=CHUNK, left_context_frames=128)
    whole = (int(lens[0]) // (CHUNK // 2) - 1) * (CHUNK // 2)  # the chunks before the last, short one
    assert rel(streamed[:whole], offline[0, :whole]) < 1e-4
    encoder.prepare_streaming(CHUNK, LEFT_CHUNKS)
    assert rel(stream_stateful(encoder, fbank)[:whole], offline[0, :whole]) > 1e-3


# -- the public streaming engine ---------------------------------------------------------------------------
def record_hidden(engine) -> dict[str, list[torch.Tensor]]:
    """Wrap the executor's backend so every chunk's valid hidden frames are kept per request id."""
    backend = engine._streaming.backend
    forward = backend.forward
    seen: dict[str, list[torch.Tensor]] = {}

    def recording(streams, feats, feat_lens, offsets):
        hidden, lengths = forward(streams, feats, feat_lens, offsets)
        for row, stream in enumerate(streams):
            seen.setdefault(stream.request_id, []).append(hidden[row, : int(lengths[row])].clone())
        return hidden, lengths

    backend.forward = recording
    return seen


def read_clip(fixtures_dir, clip) -> np.ndarray:
    data, rate = sf.read(str(clip_path(fixtures_dir, clip)), dtype="int16")
    assert rate == 16000
    return data.astype(np.float32) / 32768


@pytest.mark.parametrize("name", CAUSAL)
def test_engine_streams_from_audio_like_icefall(fixtures_dir, fixture_refs, name):
    engine = streaming_engine(fixtures_dir, name)
    seen = record_hidden(engine)
    waves = [read_clip(fixtures_dir, clip) for clip in CLIPS]
    outputs = engine.transcribe_outputs(waves, streaming=True)
    for out, clip in zip(outputs, CLIPS, strict=True):
        assert out.error is None and out.finished
        ref = fixture_refs[name][clip]["stream.encoder_out"]
        hidden = torch.cat(seen[out.request_id])
        assert hidden.shape == ref.shape
        assert rel(hidden, ref) < 1e-4


def ctc_greedy(ids: list[int]) -> list[int]:
    return [t for i, t in enumerate(ids) if t != 0 and (i == 0 or ids[i - 1] != t)]


def test_streaming_ctc_hypotheses_equal_icefalls_stream(fixtures_dir, fixture_refs):
    """The streaming CTC search (public API, from audio) gives icefall's greedy CTC over its streamed
    encoder output (the fixture's ``stream.ctc_greedy_hyp``).  Features from audio differ from the
    fixture's by float noise, so a frame whose lead is under ten times the measured log-prob
    difference (at most 5 % of them) takes this engine's own choice."""
    name = "zipformer_ctc_causal"
    engine = streaming_engine(fixtures_dir, name)
    seen = record_hidden(engine)
    waves = [read_clip(fixtures_dir, clip) for clip in CLIPS]
    outputs = engine.transcribe_outputs(waves, streaming=True)
    for out, clip in zip(outputs, CLIPS, strict=True):
        ref = fixture_refs[name][clip]
        ref_log_probs = ref["stream.ctc_log_probs"]
        assert ctc_greedy(ref_log_probs.argmax(-1).tolist()) == ref["stream.ctc_greedy_hyp"].tolist()
        with torch.inference_mode():
            log_probs = engine.model.ctc_log_probs(torch.cat(seen[out.request_id])[None])[0]
        noise = float((log_probs - ref_log_probs).abs().max())
        assert noise < 1e-3
        top = ref_log_probs.topk(2, dim=-1).values
        safe = (top[:, 0] - top[:, 1]) > 10 * noise
        assert float(safe.float().mean()) >= 0.95
        ours, theirs = log_probs.argmax(-1), ref_log_probs.argmax(-1)
        assert torch.equal(ours[safe], theirs[safe])
        assert out.error is None
        assert out.tokens == ctc_greedy(torch.where(safe, theirs, ours).tolist())
        assert len(out.tokens) >= 15


def test_sixteen_interleaved_streams_equal_each_alone_with_a_constant_pool(fixtures_dir):
    """16 streams of different lengths fed in uneven pieces, interleaved, stepping together, equal each
    stream alone; the pool is allocated once and neither grows nor moves over a long run."""
    name = "zipformer_ctc_causal"
    base = [read_clip(fixtures_dir, clip) for clip in CLIPS]
    rng = np.random.default_rng(14)
    audio = [np.concatenate([base[i % 2], base[1 - i % 2][: 1600 * (i + 1)]]) * (0.5 + 0.05 * i) for i in range(16)]
    audio[15] = np.concatenate([audio[15]] * 4)  # a long one: 19.6 s, 63 chunks
    engine = streaming_engine(fixtures_dir, name, max_streams=16)
    executor = engine._streaming
    pool_bytes = executor.pool_bytes()
    pointers = {n: t.data_ptr() for n, t in executor.backend.states.items()}
    seen = record_hidden(engine)
    ids = [engine.add_streaming_request(request_id=f"s{i}") for i in range(16)]
    pos = [0] * 16
    finals = {}
    while len(finals) < 16:
        for i in rng.permutation(16):
            if pos[i] < audio[i].size:
                piece = int(rng.integers(300, 9000))
                engine.feed_chunk(ids[i], audio[i][pos[i]: pos[i] + piece], is_last=pos[i] + piece >= audio[i].size)
                pos[i] += piece
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        assert executor.pool_bytes() == pool_bytes
    assert {n: t.data_ptr() for n, t in executor.backend.states.items()} == pointers
    assert len(seen["s15"]) > 60
    alone = streaming_engine(fixtures_dir, name, max_streams=1)
    alone_seen = record_hidden(alone)
    for i in range(16):
        out = alone.transcribe_outputs([audio[i]], streaming=True)[0]
        mine, theirs = torch.cat(seen[f"s{i}"]), torch.cat(alone_seen[out.request_id])
        assert mine.shape == theirs.shape
        assert rel(mine, theirs) < 1e-5
        assert finals[f"s{i}"].tokens == out.tokens and len(out.tokens) > 5


def greedy_path_noise(model, ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Along icefall's greedy path over ``ref``: the largest joiner log-prob difference between the two
    encoder outputs and the smallest top-2 lead of ``ref``'s log-probs."""
    predictor, joiner = model.predictor, model.joiner
    enc_ours, enc_ref = joiner.project_encoder(ours), joiner.project_encoder(ref)
    state = predictor.init_state(1, ref.device)
    noise, lead = 0.0, math.inf
    for t in range(ref.shape[0]):
        pred = joiner.project_predictor(predictor.predict(state))
        theirs = joiner.joint(enc_ref[t:t + 1], pred).log_softmax(-1)
        noise = max(noise, float((joiner.joint(enc_ours[t:t + 1], pred).log_softmax(-1) - theirs).abs().max()))
        top = theirs.topk(2, dim=-1).values[0]
        lead = min(lead, float(top[0] - top[1]))
        token = int(theirs.argmax(-1))
        if token != predictor.blank_id:
            state = predictor.advance(state, torch.tensor([token]), torch.tensor([True]))
    return noise, lead


@pytest.mark.parametrize("search", ["greedy", "modified_beam_search_4"])
def test_streaming_transducer_hypotheses_equal_icefalls_stream(fixtures_dir, fixture_refs, search):
    """icefall's streaming greedy search / modified beam search 4 (``decode_one_chunk``): the stream search
    fed icefall's own streamed encoder output chunk by chunk, and the public streaming engine from audio.

    From audio the encoder output differs by float noise: a clip's from-audio hypothesis must equal icefall's
    where its margin is above that noise (greedy: every step leads by more than ten times the joiner log-prob
    difference; the beam: the best hypothesis leads the rest of its 4-best, length normalized as icefall picks
    it, by more than twice the most that difference can move a score), and at least one clip must be so
    guarded.  The noise depends on the machine's vector width and on how the engine batched the two streams'
    chunks: in one full-suite run on an AVX2 core (Zen 3) the beam's clip0 led its runner-up by 1.35e-3 against
    a bound of 1.36e-3 (run alone there, both clips are guarded)."""
    name = "zipformer_transducer_causal"
    key = "stream.greedy_search_hyp" if search == "greedy" else "stream.modified_beam_search_4_hyp"
    beam = search != "greedy"
    engine = streaming_engine(fixtures_dir, name)
    model = engine.model
    seen = record_hidden(engine)
    waves = [read_clip(fixtures_dir, clip) for clip in CLIPS]
    outputs = engine.transcribe_outputs(waves, streaming=True, decoding=DecodingOptions(beam_size=4 if beam else 1))
    guarded = []
    for out, clip in zip(outputs, CLIPS, strict=True):
        ref = fixture_refs[name][clip]
        expected, encoder_out = ref[key].tolist(), ref["stream.encoder_out"]
        exact = engine.strategy.stream_search(DecodingOptions(beam_size=4, n_best=4) if beam else DecodingOptions())
        with torch.inference_mode():
            for start in range(0, encoder_out.shape[0], CHUNK // 2):
                exact.advance(encoder_out[start: start + CHUNK // 2])
            hyp = exact.final([], engine._streaming.frame_seconds)
            noise, lead = greedy_path_noise(model, torch.cat(seen[out.request_id]), encoder_out)
        assert hyp.tokens == expected and len(expected) > 30
        assert noise < 1e-3
        assert out.error is None
        if beam:
            context = model.predictor.context_size
            bound = (encoder_out.shape[0] + max(len(h.tokens) for h in hyp.nbest)) * noise
            best = hyp.nbest[0]
            safe = all(best.score / (len(best.tokens) + context) - other.score / (len(other.tokens) + context)
                       > 2 * (bound / (len(best.tokens) + context) + bound / (len(other.tokens) + context))
                       for other in hyp.nbest[1:])
        else:
            safe = lead > 10 * noise
        if safe:
            assert out.tokens == expected, clip
            guarded.append(clip)
    assert guarded, "no clip's margin is above the float noise: the from-audio hypotheses were not compared"


def test_streams_shorter_than_a_window_finish_beside_a_full_one(fixtures_dir, fixture_refs):
    """Streams of 5 ms and 50 ms (less than one embed frame / one window of audio) end cleanly in the
    same steps as a full clip, whose hypothesis is icefall's."""
    engine = streaming_engine(fixtures_dir, "zipformer_transducer_causal")
    wave = read_clip(fixtures_dir, "clip0")
    outputs = engine.transcribe_outputs([wave[:80], wave, wave[:800]], streaming=True)
    assert all(o.finished and o.error is None and o.finish_reason == "stop" for o in outputs)
    expected = fixture_refs["zipformer_transducer_causal"]["clip0"]["stream.greedy_search_hyp"].tolist()
    assert outputs[1].tokens == expected
