"""Core picks a kernel slot's device variant by the tensor's device, and only then.

No GPU is needed: a plugin registers ``@meta`` variants and the tests hand core tensors on torch's
``meta`` device (a device that is not the CPU), which is exactly the path a CUDA tensor takes.
"""

from __future__ import annotations

import pytest
import torch

from oasr import plugins
from oasr.decoding.ctc import ctc_greedy_search, ctc_prefix_beam_search
from oasr.features.spectral import Fbank
from oasr.hookspecs import hookimpl
from oasr.layers._backend import clear_kernel_cache, kernel

CALLS: list[tuple[str, str]] = []


def fake_greedy(log_probs, lengths, blank=0):
    CALLS.append(("ctc_greedy_search", log_probs.device.type))
    return ["greedy-on-device"]


def fake_beam(log_probs, lengths, **kwargs):
    CALLS.append(("ctc_prefix_beam_search", log_probs.device.type))
    return [["beam-on-device"]]


def fake_stft_mel(source, counts, out, **kwargs):
    CALLS.append(("stft_mel", source.device.type))


class MetaKernels:
    @hookimpl
    def oasr_register_kernels(self, register):
        register("ctc_greedy_search@meta", f"{__name__}:fake_greedy")
        register("ctc_prefix_beam_search@meta", f"{__name__}:fake_beam")
        register("stft_mel@meta", f"{__name__}:fake_stft_mel")


@pytest.fixture
def meta_kernels(monkeypatch):
    monkeypatch.delenv("OASR_KERNELS", raising=False)
    clear_kernel_cache()
    CALLS.clear()
    plugins.register_plugin(MetaKernels(), name="meta-kernels")
    yield
    plugins.unregister_plugin("meta-kernels")
    clear_kernel_cache()


def test_device_tensors_go_to_the_device_variant(meta_kernels):
    log_probs = torch.zeros(1, 4, 3, device="meta")
    assert ctc_greedy_search(log_probs, [4]) == ["greedy-on-device"]
    assert ctc_prefix_beam_search(log_probs, [4], beam_size=2) == [["beam-on-device"]]
    Fbank(sample_rate=1600, num_mel_bins=10).to("meta")(torch.zeros(1, 56, device="meta"), torch.tensor([56]))
    assert CALLS == [("ctc_greedy_search", "meta"), ("ctc_prefix_beam_search", "meta"), ("stft_mel", "meta")]


def test_cpu_tensors_never_use_a_device_variant(meta_kernels):
    log_probs = torch.randn(1, 5, 3).log_softmax(-1)
    hyp = ctc_greedy_search(log_probs, [5])[0]
    assert hyp.tokens == [u for i, u in enumerate(log_probs[0].argmax(-1).tolist())
                          if u != 0 and (i == 0 or log_probs[0, i - 1].argmax() != u)]
    ctc_prefix_beam_search(log_probs, [5], beam_size=2)
    Fbank(sample_rate=1600, num_mel_bins=10)(torch.randn(1, 56), torch.tensor([56]))
    assert CALLS == []


def test_lookup_names_the_device_kind(meta_kernels):
    assert kernel("stft_mel", torch.device("meta")).__name__ == "fake_stft_mel"
    assert kernel("stft_mel", "meta") is kernel("stft_mel", torch.device("meta"))
    assert kernel("stft_mel") is None  # no CPU kernel in this slot: the torch path
    assert kernel("ctc_prefix_beam_search", "cpu") is kernel("ctc_prefix_beam_search")


def test_oasr_kernels_registers_the_cuda_variants(monkeypatch):
    monkeypatch.delenv("OASR_KERNELS", raising=False)
    clear_kernel_cache()
    registry = plugins.registry("kernels")
    for slot in ("stft_mel", "ctc_greedy_search", "ctc_prefix_beam_search", "transducer_greedy_search"):
        assert f"{slot}@cuda" in registry
        assert registry.get(f"{slot}@cuda").distribution == "oasr-kernels"
    from oasr_kernels.cuda import features

    assert kernel("stft_mel", torch.device("cuda", 0)) is features.stft_mel
    monkeypatch.setenv("OASR_KERNELS", "0")
    clear_kernel_cache()
    assert kernel("stft_mel", "cuda") is None
    clear_kernel_cache()
