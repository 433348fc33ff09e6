"""Shared benchmark helpers: the machine description, test audio and a WeNet-sized model bundle."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import torch


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op thread(s), Python {platform.python_version()}")


def synth(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """Non-stationary audio (chirp, modulation, pulses, noise) — not silence, not white noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    f0, f1 = rng.uniform(100, 400), rng.uniform(800, 3000)
    x = 0.3 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t ** 2 / (2 * max(seconds, 1e-3))))
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(1, 5) * t)
    x += 0.2 * (np.sin(2 * np.pi * rng.uniform(2, 8) * t) > 0.95) * rng.standard_normal(n)
    x += 0.01 * rng.standard_normal(n)
    return np.clip(x, -1, 1).astype(np.float32)


def wenet_sized_bundle(path: Path, *, layers: int = 12, d_model: int = 256, heads: int = 4,
                       vocab: int = 5000, causal: bool = True, seed: int = 0, blank_bias: float = 2.0) -> Path:
    """A native bundle of a WeNet-sized U2++ Conformer with random weights.

    The CTC head's blank logit is raised by ``blank_bias`` so that, like a trained model, most frames
    are blank (a random head would emit a token almost every frame and overstate decode cost).
    """
    from oasr.checkpoints.loaded import LoadedModel
    from oasr.checkpoints.native import save_native
    from oasr.models import DecodingDefaults, FeatureSpec, LoadReport, TokenizerSpec
    from oasr_models_wenet.config import ConformerEncoderConfig, ConformerModelConfig
    from oasr_models_wenet.model import ConformerModel

    if (path / "oasr_config.json").is_file():
        return path
    torch.manual_seed(seed)
    encoder = ConformerEncoderConfig(output_size=d_model, attention_heads=heads, linear_units=4 * d_model // 2 * 2,
                                     num_blocks=layers, cnn_module_kernel=15, causal=causal,
                                     use_dynamic_chunk=True, cnn_module_norm="layer_norm" if causal else "batch_norm")
    config = ConformerModelConfig(vocab_size=vocab, encoder=encoder)
    model = ConformerModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)
        model.ctc.ctc_lo.bias.zero_()
        model.ctc.ctc_lo.bias[0] = blank_bias
        if model.encoder.global_cmvn is not None:
            model.encoder.global_cmvn.mean.fill_(10.0)
            model.encoder.global_cmvn.istd.fill_(0.25)
    path.mkdir(parents=True, exist_ok=True)
    units = path / "units.txt"
    units.write_text("".join(f"{'<blank>' if i == 0 else f'▁w{i}'} {i}\n" for i in range(vocab)))
    loaded = LoadedModel(model=model, architecture="conformer", config=config,
                         tokenizer_spec=TokenizerSpec(kind="symbol_table", files={"units": str(units)},
                                                      special_ids=(0,)),
                         feature_spec=FeatureSpec(kind="kaldi_fbank", audio_scale=32768.0),
                         decoding_defaults=DecodingDefaults(decode_type="ctc", blank_id=0),
                         load_report=LoadReport(), source=path, tokenizer_root=path)
    bundle = path / "bundle"
    save_native(loaded, bundle, overwrite=True)
    for item in bundle.iterdir():
        item.rename(path / item.name)
    bundle.rmdir()
    return path
