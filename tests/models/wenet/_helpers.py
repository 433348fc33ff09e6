"""Comparison helpers of the WeNet family tests."""

from __future__ import annotations

import attrs
import torch

from oasr_models_wenet.config import ConformerEncoderConfig, ConformerModelConfig
from oasr_models_wenet.model import ConformerModel


def assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4) -> None:
    """max |actual - expected| within ``tol`` of max |expected| (shapes equal)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol} x {scale:.3g}"


def encode_ref(model, fbank: torch.Tensor, chunk: int, left: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder output the fixture decoded for a run (the masked chunk forward for chunked runs)."""
    with torch.no_grad():
        return model.encoder(fbank[None], torch.tensor([fbank.size(0)]), chunk_size=chunk, num_left_chunks=left)


def small_conformer(seed: int, *, random_norm_stats: bool = False, **overrides) -> ConformerModel:
    """A 2-block causal Conformer (24 mels, 64 wide) with non-trivial pos_bias_u/v; ``random_norm_stats``
    also randomizes the conv module's norm (its running statistics and affine), so a batch-norm fold is
    exercised with statistics that are not the identity.  ``overrides`` evolve the encoder config."""
    encoder = ConformerEncoderConfig(input_dim=24, output_size=64, attention_heads=4, linear_units=96, num_blocks=2,
                                     cnn_module_kernel=7, causal=True, cnn_module_norm="layer_norm",
                                     use_dynamic_chunk=True)
    encoder = attrs.evolve(encoder, **overrides)
    torch.manual_seed(seed)
    model = ConformerModel(ConformerModelConfig(vocab_size=40, encoder=encoder)).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith(("pos_bias_u", "pos_bias_v")):
                tensor.normal_(0, 0.3)
            elif not random_norm_stats:
                continue
            elif name.endswith(".norm.running_mean"):
                tensor.normal_(0, 0.5)
            elif name.endswith(".norm.running_var"):
                tensor.uniform_(0.3, 2.0)
            elif ".conv_module.norm." in name and name.endswith((".weight", ".bias")):
                tensor.normal_(0.5 if name.endswith(".weight") else 0.0, 0.3)
    return model
