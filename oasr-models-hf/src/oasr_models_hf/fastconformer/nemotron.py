"""Nemotron ASR (Hugging Face ``nemotron_asr_streaming`` and ``nemotron3_5_asr``): the cache-aware FastConformer
encoder (:mod:`oasr_models_hf.fastconformer.nemotron_encoder`), NeMo's 2-layer LSTM predictor and additive joint
(:mod:`oasr_models_hf.fastconformer.predictor`), decoded by the core ``transducer`` family.

``nemotron3_5_asr`` adds the language prompt: upstream concatenates a ``num_prompts``-wide one-hot of the
prompt id onto every encoder frame before ``prompt_projector`` (``linear_2(relu(linear_1([h, onehot])))``, no
residual: its output replaces the encoder output before the joint's encoder projection).  Here the one-hot's
columns of ``linear_1`` are folded with its bias into a per-prompt table at load (``W_h h + (W_p[:, id] + b)``),
so each row adds its own prompt's row of it; within one float rounding of the concat.

The prompt is per request: ``DecodingOptions.language`` resolves against the checkpoint's own
``processor_config.json`` ``prompt_dictionary`` (:meth:`Nemotron35AsrConfig.prompt_id`); no language means
``default_prompt_id`` (101, ``auto``: the model's own language ID).  A language the table cannot resolve is
refused at admission.

Converters: a directory is claimed when its ``config.json`` says ``model_type`` ``"nemotron_asr_streaming"`` or
``"nemotron3_5_asr"`` (specificity 30).  The frontend is NeMo's log-mel (``nemotron_logmel``) without
normalization, with the feature extractor's ``mel_filters_dtype``; ``num_lookahead_tokens`` is the processor's
``default_num_lookahead_tokens`` (what transformers' processor hands ``generate``), else the encoder config's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from oasr.errors import ConfigError, RequestError
from oasr.layers import Linear, Relu
from oasr.models.base import BaseAsrModel
from oasr.models.specs import DecodingDefaults, FeatureSpec
from oasr_models_hf.fastconformer.config import ParakeetCtcConfig, ParakeetRnntConfig
from oasr_models_hf.fastconformer.convert import (
    ParakeetRnntConverter,
    encoder_fields,
    feature_extractor_settings,
    nemo_feature_spec,
)
from oasr_models_hf.fastconformer.model import FastConformerModel
from oasr_models_hf.fastconformer.nemotron_encoder import NemotronEncoder
from oasr_models_hf.fastconformer.predictor import CtcHead, LstmTransducerHeads
from oasr_models_hf.lasr.convert import read_json


@attrs.define(kw_only=True)
class NemotronAsrConfig(ParakeetRnntConfig):
    """``nemotron_asr_streaming``: the Parakeet RNN-T fields plus the trained attention geometry."""

    vocab_size: int = 1025
    blank_id: int = 1024
    #: K/V window in encoder frames: the frame itself plus ``sliding_window - 1`` of left context
    sliding_window: int = 71
    #: right context (lookahead) in encoder frames; the trained chunk is ``num_lookahead_tokens + 1``
    num_lookahead_tokens: int = 13
    #: () for RNN-T; a cache-aware TDT ``.nemo`` model's durations (the joint's extra logits)
    tdt_durations: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    @property
    def durations(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.tdt_durations)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.tdt_durations and min(self.tdt_durations) < 0:
            raise ConfigError(f"TDT durations must be frame counts >= 0, got {list(self.tdt_durations)}",
                              key="durations")
        if self.sliding_window < 1:
            raise ConfigError(f"sliding_window must be >= 1, got {self.sliding_window}", key="sliding_window")
        if self.num_lookahead_tokens < 0:
            raise ConfigError(f"num_lookahead_tokens must be >= 0, got {self.num_lookahead_tokens}",
                              key="num_lookahead_tokens")


@attrs.define(kw_only=True)
class Nemotron35AsrConfig(NemotronAsrConfig):
    """``nemotron3_5_asr``: + the language-prompt projector and the processor's prompt table."""

    vocab_size: int = 13088
    blank_id: int = 13087
    num_prompts: int = 128
    prompt_intermediate_size: int = 2048
    default_prompt_id: int = 101
    #: the checkpoint's ``processor_config.json`` ``prompt_dictionary`` (locale or code → prompt id)
    prompt_dictionary: dict[str, int] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for name, pid in [("default_prompt_id", self.default_prompt_id), *self.prompt_dictionary.items()]:
            if not 0 <= int(pid) < self.num_prompts:
                raise ConfigError(f"prompt id {pid} of {name!r} is outside the {self.num_prompts} prompts",
                                  key="prompt_dictionary")

    def prompt_id(self, language: str) -> int:
        """The prompt of ``language``: the code itself if listed, else its ``xx-XX`` spelling, else the one
        slot all its ``xx-*`` locales share; raises :class:`ValueError` otherwise."""
        table = self.prompt_dictionary
        if language in table:
            return int(table[language])
        spelled = f"{language}-{language.upper()}"
        if spelled in table:
            return int(table[spelled])
        slots = {int(v) for k, v in table.items() if k.split("-")[0] == language and "-" in k}
        if len(slots) == 1:
            return slots.pop()
        known = sorted({k.split("-")[0] for k in table if k != "auto"})
        if slots:
            raise ValueError(f"language {language!r} is ambiguous in this checkpoint's prompt table: its locales "
                             f"map to prompts {sorted(slots)}; name one of "
                             f"{sorted(k for k in table if k.split('-')[0] == language)}")
        raise ValueError(f"language {language!r} is not in this checkpoint's prompt table "
                         f"(processor_config.json prompt_dictionary); known: {', '.join(known) or '(none)'}")


class NemotronPromptProjector(nn.Module):
    """``linear_2(relu(linear_1 h + table[prompt]))``: upstream's one-hot concat folded into ``prompt_table``."""

    def __init__(self, config: Nemotron35AsrConfig):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.linear_1 = Linear(config.hidden_size, config.prompt_intermediate_size, bias=False)
        self.prompt_table = nn.Parameter(torch.zeros(config.num_prompts, config.prompt_intermediate_size))
        self.act = Relu()
        self.linear_2 = Linear(config.prompt_intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
        rows = self.prompt_table.index_select(0, prompt_ids.to(self.prompt_table.device))
        return self.linear_2(self.act(self.linear_1(hidden) + rows[:, None, :].to(hidden.dtype)))


class NemotronAsrStreamingModel(LstmTransducerHeads, BaseAsrModel):
    """``nemotron_asr_streaming``: encoder, LSTM predictor and additive joint (transformers'
    ``NemotronAsrStreamingForRNNT``; ``encoder_projector`` / ``decoder.decoder_projector`` live in the joint)."""

    config_class = NemotronAsrConfig
    #: the trained window bounds attention, and offline attention runs in blocks: memory grows with T
    max_segment_seconds = None

    def __init__(self, config: NemotronAsrConfig):
        super().__init__(config)
        self.encoder = NemotronEncoder(config)
        self._build_heads(config)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    quantization_layout = FastConformerModel.quantization_layout

    def extra_repr(self) -> str:
        c = self.config
        return (f"hidden={c.hidden_size}, layers={c.num_hidden_layers}, vocab={c.vocab_size}, "
                f"lookahead={c.num_lookahead_tokens}, window={c.sliding_window}, "
                f"predictor={c.num_decoder_layers}x{c.decoder_hidden_size}")


@attrs.define(kw_only=True)
class NemotronCtcConfig(ParakeetCtcConfig):
    """A cache-aware FastConformer CTC model (a NeMo ``.nemo`` archive): the CTC fields plus the trained attention
    geometry of :class:`NemotronAsrConfig`."""

    sliding_window: int = 71
    num_lookahead_tokens: int = 13

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.sliding_window < 1:
            raise ConfigError(f"sliding_window must be >= 1, got {self.sliding_window}", key="sliding_window")
        if self.num_lookahead_tokens < 0:
            raise ConfigError(f"num_lookahead_tokens must be >= 0, got {self.num_lookahead_tokens}",
                              key="num_lookahead_tokens")


class NemotronCtcStreamingModel(CtcHead, BaseAsrModel):
    """The cache-aware encoder and a CTC head (``ctc_head``), decoded by the core ``ctc`` family offline and
    streaming."""

    config_class = NemotronCtcConfig
    max_segment_seconds = None

    def __init__(self, config: NemotronCtcConfig):
        super().__init__(config)
        self.encoder = NemotronEncoder(config)
        self._build_ctc_head(config)

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(feats, feat_lens)

    quantization_layout = FastConformerModel.quantization_layout


class Nemotron35AsrModel(NemotronAsrStreamingModel):
    """``nemotron3_5_asr``: + the language prompt, per request (``DecodingOptions.language``)."""

    config_class = Nemotron35AsrConfig
    encoder_options = frozenset({"language"})

    def __init__(self, config: Nemotron35AsrConfig):
        super().__init__(config)
        self.prompt_projector = NemotronPromptProjector(config)
        # streaming applies the stream's prompt inside the chunk forward (a plain tuple: not a submodule)
        self.encoder.prompt_hook = (self.prompt_projector, config.default_prompt_id, self.resolve_prompt)

    def remap_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = super().remap_state_dict(state_dict)
        weight = out.get("prompt_projector.linear_1.weight")
        hidden = self.config.hidden_size
        if weight is not None and weight.shape[1] == hidden + self.config.num_prompts:
            bias = out.pop("prompt_projector.linear_1.bias", None)
            table = weight[:, hidden:].t().float()
            if bias is not None:
                table = table + bias.float()[None, :]
            out["prompt_projector.linear_1.weight"] = weight[:, :hidden].contiguous()
            out["prompt_projector.prompt_table"] = table.to(weight.dtype).contiguous()
        return out

    def resolve_prompt(self, language: str | None) -> int:
        return self.config.default_prompt_id if language is None else self.config.prompt_id(language)

    def validate_encoder_request(self, options: Any, request_id: str | None = None) -> None:
        """Refuse, at admission, a language the checkpoint's prompt table cannot resolve."""
        try:
            self.resolve_prompt(options.language)
        except ValueError as exc:
            raise RequestError(str(exc), request_id=request_id, param="language") from exc

    def encoder_conditioning(self, options_list: list[Any]) -> dict[str, torch.Tensor] | None:
        """Each row's prompt id for :meth:`encode_offline`; None when no row names a language."""
        if all(o.language is None for o in options_list):
            return None
        ids = [self.resolve_prompt(o.language) for o in options_list]
        return {"prompt_ids": torch.tensor(ids, dtype=torch.long, device=self.device)}

    def encode_offline(self, feats: torch.Tensor, feat_lens: torch.Tensor,
                       prompt_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, lengths = self.encoder(feats, feat_lens)
        if prompt_ids is None:
            prompt_ids = torch.full((hidden.shape[0],), self.config.default_prompt_id, dtype=torch.long,
                                    device=hidden.device)
        return self.prompt_projector(hidden, prompt_ids), lengths


# -- converters ----------------------------------------------------------------------------------------------------
class NemotronAsrStreamingConverter(ParakeetRnntConverter):
    """A Hugging Face ``nemotron_asr_streaming`` directory."""

    architecture = "nemotron_asr_streaming"
    hf_model_type = "nemotron_asr_streaming"
    config_class = NemotronAsrConfig

    def head_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        enc = raw.get("encoder_config") or {}
        fields: dict[str, Any] = {}
        if "sliding_window" in enc:
            fields["sliding_window"] = int(enc["sliding_window"])
        lookahead = enc.get("default_num_lookahead_tokens")
        processor = self._processor(self._path)
        if processor.get("default_num_lookahead_tokens") is not None:
            lookahead = processor["default_num_lookahead_tokens"]
        elif processor.get("supported_num_lookahead_tokens"):
            lookahead = processor["supported_num_lookahead_tokens"][0]
        if lookahead is not None:
            fields["num_lookahead_tokens"] = int(lookahead)
        return fields

    @staticmethod
    def _processor(path: Path) -> dict[str, Any]:
        file = path / "processor_config.json"
        return read_json(file) if file.is_file() else {}

    def build_config(self, path: Path, state_dict: dict[str, torch.Tensor]) -> NemotronAsrConfig:
        self._path = Path(path)
        encoder_fields(read_json(self._path / "config.json"), self._path)  # refuses what the encoder cannot be
        return super().build_config(path, state_dict)

    def feature_spec(self, path: Path, config: NemotronAsrConfig) -> FeatureSpec:
        path = Path(path)
        spec = nemo_feature_spec(path, config.num_mel_bins)
        dtype = feature_extractor_settings(path).get("mel_filters_dtype", "float32")
        return attrs.evolve(spec, normalize=None, options={**spec.options, "mel_filters_dtype": str(dtype)})

    def decoding_defaults(self, path: Path, config: NemotronAsrConfig) -> DecodingDefaults:
        return DecodingDefaults(decode_type="transducer", blank_id=config.blank_id,
                                options={"max_symbols": config.max_symbols_per_step})


class Nemotron35AsrConverter(NemotronAsrStreamingConverter):
    """A Hugging Face ``nemotron3_5_asr`` directory (prompt table from ``processor_config.json``)."""

    architecture = "nemotron3_5_asr"
    hf_model_type = "nemotron3_5_asr"
    config_class = Nemotron35AsrConfig

    def head_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        fields = super().head_fields(raw)
        for key in ("num_prompts", "prompt_intermediate_size", "default_prompt_id"):
            if key in raw:
                fields[key] = int(raw[key])
        table = self._processor(self._path).get("prompt_dictionary") or {}
        fields["prompt_dictionary"] = {str(k): int(v) for k, v in table.items()}
        return fields


__all__ = ["Nemotron35AsrConfig", "Nemotron35AsrConverter", "Nemotron35AsrModel", "NemotronAsrConfig",
           "NemotronAsrStreamingConverter", "NemotronAsrStreamingModel", "NemotronCtcConfig",
           "NemotronCtcStreamingModel"]
