"""Cache-aware streaming of the Nemotron encoder (slot backend): every chunk's encoder output equals the offline
encoder under the same trained mask, streaming text equals offline text, 16 interleaved streams equal each alone,
the per-stream prompt id, and the geometry preconditions refused at engine construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.checkpoints.loading import load_pretrained
from oasr.engine import Engine, EngineConfig
from oasr.engine.options import DecodingOptions
from oasr.errors import CapabilityError
from oasr.features import FeatureConfig, extract_features_batch
from oasr.layers.derived import kept

from .conftest import states_for
from .conftest import stream_by_hand as _stream_by_hand

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def loaded(any_dir):
    return load_pretrained(any_dir)


def _offline(model, feats, prompt=None):
    lens = torch.tensor([feats.shape[0]])
    with torch.no_grad():
        if prompt is None:
            hidden, n = model.encode_offline(feats[None], lens)
        else:
            hidden, n = model.encode_offline(feats[None], lens, prompt_ids=torch.tensor([prompt]))
    return hidden[0, :int(n[0])]


@pytest.mark.parametrize("chunk", [2, 4, 6])
def test_every_chunk_equals_the_offline_encoder(loaded, speech, chunk):
    encoder = loaded.model.encoder
    prompt = 4 if loaded.architecture == "nemotron3_5_asr" else None
    feats, lengths = extract_features_batch([torch.from_numpy(a) for a in speech],
                                            FeatureConfig.from_spec(loaded.feature_spec))
    for row, n in enumerate(lengths.tolist()):
        for cut in (n, n - 3, 37, 9):  # window-aligned and ragged ends, a stream shorter than one window
            offline = _offline(loaded.model, feats[row, :cut], prompt)
            chunks = _stream_by_hand(encoder, feats[row, :cut], chunk, prompt)
            assert all(c.shape[0] == chunk for c in chunks[:-1])
            streamed = torch.cat(chunks)
            assert streamed.shape == offline.shape
            err = float((streamed - offline).abs().max() / offline.abs().max())
            assert err < 1e-4, f"clip {row} cut {cut} chunk {chunk}: relative error {err:.2e}"


def test_a_chunk_size_off_the_trained_chunks_is_refused_at_construction(any_dir):
    with pytest.raises(CapabilityError, match="whole number of trained attention chunks.*num_lookahead_tokens"):
        Engine(EngineConfig(model=str(any_dir), service_mode="streaming", chunk_size=3))


def test_the_default_chunk_is_one_trained_chunk(any_dir, loaded):
    """EngineConfig(chunk_size=None), the default, streams at the encoder's trained chunk, not a generic 16."""
    engine = Engine(EngineConfig(model=str(any_dir), service_mode="streaming"))
    assert engine._streaming.chunk_size == loaded.model.encoder.attention_chunk
    assert loaded.model.encoder.default_chunk_size == loaded.model.encoder.attention_chunk


def test_state_declarations(loaded):
    encoder = loaded.model.encoder
    encoder.prepare_streaming(4, -1)
    specs = {s.name: s for s in encoder.streaming_state_specs}
    assert encoder.streaming_kind == "slot"
    assert {"delay", "sub0", "sub1", "sub2", "kv", "conv"} <= set(specs)
    # the K/V ring: the trained history and the chunk the engine streams at
    assert specs["kv"].shape[4] == encoder.left_chunks * encoder.attention_chunk + 4
    assert specs["conv"].shape[2] == loaded.config.conv_kernel_size - 1
    if loaded.architecture == "nemotron3_5_asr":
        assert specs["prompt"].persistent and specs["prompt"].fill_value == loaded.config.default_prompt_id
    else:
        assert "prompt" not in specs


def test_the_kv_ring_is_written_in_place(loaded, speech):
    """A chunk writes its keys and values into its own slots of the stream's ring (absolute frame p in slot
    p mod ring) in the state tensor it was handed, and leaves the other slots as they were."""
    encoder = loaded.model.encoder
    chunk = 4
    encoder.prepare_streaming(chunk, -1)
    ring = encoder.ring_frames
    feats, _ = extract_features_batch([torch.from_numpy(speech[0])], FeatureConfig.from_spec(loaded.feature_spec))
    states = states_for(encoder)
    width = encoder.streaming_geometry(chunk).window_frames
    offset = 0
    with torch.no_grad():
        for pos in range(0, 6 * width, width):  # past one turn of the ring (ring < 6 chunks)
            kv = states["kv"]
            before = kv.clone()
            _, valid, updated = encoder.forward_chunk_slots(feats[:, pos:pos + width], torch.tensor([width]),
                                                            torch.tensor([offset]), states)
            assert updated["kv"] is kv  # in place: no copy of the ring per chunk
            written = [(offset + j) % ring for j in range(chunk)]
            kept = [r for r in range(ring) if r not in written]
            assert torch.equal(kv[:, :, :, :, kept], before[:, :, :, :, kept])
            assert not torch.equal(kv[:, :, :, :, written], before[:, :, :, :, written])
            states.update(updated)
            offset += int(valid[0])
    assert offset == 6 * chunk > ring


def test_prepare_streaming_packs_the_weights_before_the_first_chunk(stream_dir):
    """Engine construction runs one chunk on the packed CPU path, so the first stream's first chunk does not
    pack ~all the encoder's GEMM weights."""
    model = load_pretrained(stream_dir).model
    linear = model.encoder.layers[-1].feed_forward2.linear2
    assert not kept(linear)
    model.encoder.prepare_streaming(2, -1)
    assert any(name[0] == "packed" for name in kept(linear))


def _engine(path, **kw):
    return Engine(EngineConfig(model=str(path), service_mode="streaming", chunk_size=4, **kw))


def test_streaming_text_equals_offline(any_dir, speech):
    offline = Engine(EngineConfig(model=str(any_dir))).transcribe_outputs(list(speech))
    streamed = _engine(any_dir).transcribe_outputs(list(speech), streaming=True)
    assert sum(len(o.tokens) for o in offline) > 10
    for a, b in zip(offline, streamed, strict=True):
        assert a.tokens == b.tokens and a.text == b.text


def test_sixteen_interleaved_streams_equal_each_alone(stream_dir, speech):
    rng = np.random.default_rng(16)
    audio = [np.concatenate([speech[i % 4], speech[(i + 1) % 4][: 1600 * (i + 1)]]) for i in range(16)]
    engine = _engine(stream_dir, max_streams=16)
    ids = [engine.add_streaming_request(request_id=f"s{i}") for i in range(16)]
    pos, finals = [0] * 16, {}
    while len(finals) < 16:
        for i in rng.permutation(16):
            if pos[i] < audio[i].size:
                piece = int(rng.integers(300, 9000))
                engine.feed_chunk(ids[i], audio[i][pos[i]: pos[i] + piece], is_last=pos[i] + piece >= audio[i].size)
                pos[i] += piece
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    alone = _engine(stream_dir, max_streams=1)
    for i in range(16):
        out = alone.transcribe_outputs([audio[i]], streaming=True)[0]
        assert finals[f"s{i}"].tokens == out.tokens and len(out.tokens) > 5


def test_each_stream_keeps_its_own_language(v35_dir, speech):
    offline = Engine(EngineConfig(model=str(v35_dir), max_batch_size=1))
    engine = _engine(v35_dir, max_streams=4)
    languages = ["en", "zh", None, "zh"]
    clips = [speech[0], speech[0], speech[3], speech[3]]
    ids = [engine.add_streaming_request(request_id=f"s{i}", decoding=DecodingOptions(language=lang))
           for i, lang in enumerate(languages)]
    for rid, clip in zip(ids, clips, strict=True):
        engine.feed_chunk(rid, clip, is_last=True)
    finals = {}
    while len(finals) < len(ids):
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    for i, (lang, clip) in enumerate(zip(languages, clips, strict=True)):
        ref = offline.transcribe_outputs(clip, decoding=DecodingOptions(language=lang))
        assert finals[f"s{i}"].tokens == ref.tokens and ref.tokens
    # the same audio under two prompts decodes differently: a stream reading another's prompt would fail above
    assert finals["s0"].tokens != finals["s1"].tokens and finals["s2"].tokens != finals["s3"].tokens


def test_an_unknown_language_is_refused_when_a_stream_is_added(v35_dir):
    from oasr.errors import RequestError

    engine = _engine(v35_dir, max_streams=2)
    with pytest.raises(RequestError, match="prompt table"):
        engine.add_streaming_request(request_id="bad", decoding=DecodingOptions(language="de"))


def test_chunks_equal_transformers_own_cache_aware_streaming(any_dir, speech):
    """transformers' streaming encoder (its K/V and padding caches, first chunk 1 + 8r mel frames, then 8(r + 1))
    against ours chunk by chunk, on the frames its whole chunks produce."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.nemotron_asr_streaming.modeling_nemotron_asr_streaming import (
        NemotronAsrStreamingEncoderCausalConvPaddingCache,
    )

    from tests.models.hf.nemotron.conftest import load_hf

    loaded = load_pretrained(any_dir)
    hf, processor = load_hf(any_dir)
    r = processor.default_num_lookahead_tokens
    factor = hf.config.encoder_config.subsampling_factor
    feats = processor.feature_extractor(speech[3], sampling_rate=16000, return_tensors="pt").input_features[0]
    cache, padding = DynamicCache(config=hf.config.encoder_config), NemotronAsrStreamingEncoderCausalConvPaddingCache()
    bounds = [0, 1 + factor * r]
    while bounds[-1] + factor * (r + 1) <= feats.shape[0]:
        bounds.append(bounds[-1] + factor * (r + 1))
    theirs = []
    with torch.no_grad():
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            out = hf.encoder(input_features=feats[None, a:b], cache=cache, padding_cache=padding, use_cache=True,
                             num_lookahead_tokens=r, output_attention_mask=False)
            theirs.append(out.last_hidden_state[0])
    ours = torch.cat(_stream_by_hand(loaded.model.encoder, feats[:bounds[-1]], r + 1))
    theirs = torch.cat(theirs)
    if loaded.architecture == "nemotron3_5_asr":  # ours hands the strategy the prompted frames (default prompt)
        one_hot = torch.nn.functional.one_hot(torch.tensor(hf.config.default_prompt_id), hf.config.num_prompts)
        with torch.no_grad():
            theirs = hf.prompt_projector(torch.cat([theirs, one_hot.expand(theirs.shape[0], -1).float()], -1))
    n = theirs.shape[0]
    assert ours.shape[0] >= n == (r + 1) * (len(bounds) - 1) > 20
    err = float((ours[:n] - theirs).abs().max() / theirs.abs().max())
    assert err < 1e-4, f"relative error {err:.2e}"
