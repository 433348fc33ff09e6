"""The engine's device handling without a GPU: refusals, dtype options, CUDA-graph capture rules.

What needs a real GPU (features and decoding on ``cuda`` equal to the CPU, graphs equal to eager) is in
``test_gpu.py``, marked ``gpu`` and run by ``scripts/gpu-check.sh``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from oasr.engine import Engine, EngineConfig
from oasr.engine.device import check_dtype, resolve_device
from oasr.engine.graphs import StepGraphs, graph_refusal
from oasr.errors import ConfigError, OasrError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without a GPU")


def test_cuda_on_a_machine_without_one_is_refused_before_anything_loads():
    # the model does not exist: the device is checked first, so the error is about the device
    with pytest.raises(ConfigError, match=r"device='cuda' asks for a GPU, but .*use device='cpu'") as err:
        Engine(EngineConfig(model="/nonexistent/model", device="cuda"))
    assert err.value.key == "device"
    assert isinstance(err.value, OasrError)
    with pytest.raises(ConfigError, match="asks for a GPU"):
        Engine(EngineConfig(model="/nonexistent/model", device="cuda:1"))


@pytest.mark.parametrize(("device", "message"), [("gpu", "is not a device"), ("meta", "runs on 'cpu' or 'cuda'")])
def test_a_device_the_engine_cannot_use_is_named(device, message):
    with pytest.raises(ConfigError, match=message):
        resolve_device(device)


def test_auto_is_the_cpu_here():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "float16", "fp16", "half"])
def test_half_precision_is_a_gpu_option(dtype):
    with pytest.raises(ConfigError, match="is a GPU option") as err:
        check_dtype(dtype, torch.device("cpu"))
    assert err.value.key == "dtype"
    assert check_dtype(dtype, torch.device("cuda")) in (torch.float16, torch.bfloat16)


def test_cpu_dtypes_and_unknown_names():
    assert check_dtype(None, torch.device("cpu")) is None
    assert check_dtype("float32", torch.device("cpu")) is torch.float32
    with pytest.raises(ConfigError, match="unknown dtype 'int4'"):
        check_dtype("int4", torch.device("cpu"))


def test_a_cpu_engine_refuses_bf16_at_construction():
    with pytest.raises(ConfigError, match="GPU option"):
        Engine(EngineConfig(model="/nonexistent/model", dtype="bfloat16"))


class Encoder:
    def __init__(self, graphs: bool):
        self.supports_step_graphs = graphs


CUDA = torch.device("cuda")


@pytest.mark.parametrize(("kwargs", "reason"), [
    (dict(enabled=False, device=CUDA, streaming_kind="slot", encoder=Encoder(True)), "cuda_graphs is False"),
    (dict(enabled=True, device=torch.device("cpu"), streaming_kind="slot", encoder=Encoder(True)), "need a CUDA device"),
    (dict(enabled=True, device=CUDA, streaming_kind="slot", encoder=Encoder(False)), "does not declare"),
    (dict(enabled=True, device=CUDA, streaming_kind="stateful", encoder=Encoder(True)), "dense per-stream state"),
    (dict(enabled=True, device=CUDA, streaming_kind="paged", encoder=Encoder(True)), "K/V view whose width"),
])
def test_graph_capture_is_refused_with_the_reason(kwargs, reason):
    assert reason in graph_refusal(**kwargs)


def test_graph_capture_is_allowed_for_a_declaring_slot_encoder():
    assert graph_refusal(enabled=True, device=CUDA, streaming_kind="slot", encoder=Encoder(True)) is None


def test_one_graph_per_batch_size():
    def args(batch):
        return torch.zeros(batch, 7, 4), torch.zeros(batch, dtype=torch.long), {"conv": torch.zeros(2, batch, 3)}

    sig = StepGraphs.signature
    assert sig(args(2)) == sig(args(2))
    assert sig(args(2)) != sig(args(3))


def test_a_failed_capture_runs_that_shape_eagerly_with_one_warning():
    calls = []

    def step(feats, states):
        calls.append(feats.shape[0])
        return feats * 2, {k: v + 1 for k, v in states.items()}

    graphs = StepGraphs(step)
    with pytest.warns(RuntimeWarning, match="capture of the streaming step failed"):
        out, states = graphs(torch.ones(2, 3), {"s": torch.zeros(2)})  # no CUDA here: capture fails
    assert torch.equal(out, torch.full((2, 3), 2.0)) and torch.equal(states["s"], torch.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second attempt, no second warning
        graphs(torch.ones(2, 3), {"s": torch.zeros(2)})
    assert graphs.captured == 0 and calls[-1] == 2


def test_a_cpu_streaming_engine_runs_without_graphs_and_says_why(fixtures_dir):
    engine = Engine(EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model"), service_mode="streaming",
                                 chunk_size=4))
    executor = engine._streaming
    assert executor.step_graphs is None
    assert "need a CUDA device" in executor.graph_refusal
    assert engine.device == torch.device("cpu")
    assert executor.extractor.device == torch.device("cpu")
    engine.shutdown()


def test_offline_features_are_extracted_on_the_model_device(fixtures_dir, monkeypatch):
    import oasr.features

    original = oasr.features.extract_features_batch
    devices = []

    def recording(waveforms, config, lengths=None, *, device=None):
        devices.append(device)
        return original(waveforms, config, lengths, device=device)

    monkeypatch.setattr(oasr.features, "extract_features_batch", recording)
    engine = Engine(EngineConfig(model=str(fixtures_dir / "wenet_u2pp" / "model")))
    assert engine.transcribe_outputs([torch.zeros(8000).numpy() + 0.01])[0].finished
    assert devices == [engine.model.device]
