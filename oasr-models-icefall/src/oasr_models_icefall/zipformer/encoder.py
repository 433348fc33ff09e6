"""icefall's Zipformer2 encoder (``zipformer.py``), evaluation forward, on the OASR layer waist.

Layout inside the stacks is icefall's (T, B, C); :class:`ZipformerEncoderModel` is the OASR
:class:`BaseEncoder` face: (B, T, F) features in, (B, T', D) hidden states out, T' = ((T-7)//2 + 1)//2.

Every class keeps icefall's name, attribute names and ``forward`` signature, so the streaming code
(``streaming.py``) and checkpoint keys line up with icefall's.  Attention is decomposed on purpose:
one :class:`RelPositionMultiheadAttentionWeights` per layer materializes the probabilities and both
:class:`SelfAttention` modules and the :class:`NonlinAttention` consume them, which a fused
attention kernel (that never materializes them) cannot express.  Masked scores are filled with
-1000, not -inf, as icefall does, so a fully masked row stays a uniform average.
"""

from __future__ import annotations

import torch
from torch import nn

from oasr import layers
from oasr.errors import ConfigError
from oasr.models import BaseEncoder
from oasr_models_icefall.release import LOG_EPS
from oasr_models_icefall.zipformer.config import ZipformerEncoderConfig
from oasr_models_icefall.zipformer.scaling import (
    ActivationDropoutAndLinear,
    BiasNorm,
    BypassModule,
    ChunkCausalDepthwiseConv1d,
    CompactRelPositionalEncoding,
    SimpleDownsample,
    SimpleUpsample,
    convert_num_channels,
)
from oasr_models_icefall.zipformer.streaming import ZipformerStreaming  # slot/stateful streaming (zipformer-streaming)
from oasr_models_icefall.zipformer.subsampling import Conv2dSubsampling

#: the fewest feature frames encoder_embed's convolutions accept ((T - 7) // 2 = 1 embed frame)
MIN_FEATURE_FRAMES = 9
#: icefall fills masked attention scores with this (not -inf)
MASKED_SCORE = -1000.0


def rel_shift(pos_scores: torch.Tensor) -> torch.Tensor:
    """Position scores per relative offset (H, B, T, K + 2T - 1) → per key (H, B, T, K + T).

    Column j of ``pos_scores`` scores offset ``(n - 1) / 2 - j``; key s of query t (K cached keys
    first) is column ``T - 1 - t + s``.  Eager: icefall's strided view (no copy), so ``pos_scores``
    must be contiguous.  Traced (``torch.onnx.export``, ``torch.jit.trace``): the same columns by a
    gather over the traced shape, so the graph keeps a dynamic batch (a strided view bakes the
    tracing batch's strides in); the view is the faster one eagerly (no copy).
    """
    heads, batch, time1, n = pos_scores.shape
    keys = n - time1 + 1
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        index = (time1 - 1 - torch.arange(time1, device=pos_scores.device))[:, None] + \
            torch.arange(keys, device=pos_scores.device)[None, :]
        return pos_scores.gather(-1, index.expand(heads, batch, time1, keys))
    return pos_scores.as_strided(
        (heads, batch, time1, keys),
        (pos_scores.stride(0), pos_scores.stride(1), pos_scores.stride(2) - pos_scores.stride(3),
         pos_scores.stride(3)),
        storage_offset=pos_scores.storage_offset() + pos_scores.stride(3) * (time1 - 1),
    )


class RelPositionMultiheadAttentionWeights(nn.Module):
    """Attention probabilities (H, B, T, T) with icefall's relative-position term (no 1/sqrt(d):
    the scale is learned into ``in_proj``)."""

    def __init__(self, embed_dim: int, pos_dim: int, num_heads: int, query_head_dim: int, pos_head_dim: int):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.query_head_dim, self.pos_head_dim = query_head_dim, pos_head_dim
        self.in_proj = layers.Linear(embed_dim, (2 * query_head_dim + pos_head_dim) * num_heads)
        self.linear_pos = layers.Linear(pos_dim, num_heads * pos_head_dim, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, B, C) → q (H, B, T, dq), k (T, B, H*dq) unsplit, p (H, B, T, dp)."""
        seq_len, batch, _ = x.shape
        heads, dq, dp = self.num_heads, self.query_head_dim, self.pos_head_dim
        x = self.in_proj(x)
        q = x[..., : dq * heads].reshape(seq_len, batch, heads, dq).permute(2, 1, 0, 3)
        k = x[..., dq * heads: 2 * dq * heads]
        p = x[..., 2 * dq * heads:].reshape(seq_len, batch, heads, dp).permute(2, 1, 0, 3)
        return q, k, p

    def scores(self, q: torch.Tensor, k: torch.Tensor, p: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        """Content + position scores (H, B, T, S) from q/p of T queries, k (S, B, H*dq) of S keys."""
        heads, dq, dp = self.num_heads, self.query_head_dim, self.pos_head_dim
        keys, batch = k.shape[0], k.shape[1]
        k = k.reshape(keys, batch, heads, dq).permute(2, 1, 3, 0)
        attn_scores = torch.matmul(q, k)
        pos = self.linear_pos(pos_emb)
        pos = pos.reshape(-1, pos.shape[1], heads, dp).permute(2, 0, 3, 1)
        pos_scores = torch.matmul(p, pos).contiguous()
        return attn_scores + rel_shift(pos_scores)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (T, B, C), pos_emb (1, 2T-1, pos_dim); masks True where masked: key_padding_mask (B, T),
        attn_mask (T, T) or (B, T, T).  Returns probabilities (H, B, T, T)."""
        q, k, p = self.project(x)
        attn_scores = self.scores(q, k, p, pos_emb)
        if attn_mask is not None:
            attn_scores = attn_scores.masked_fill(attn_mask, MASKED_SCORE)
        if key_padding_mask is not None:
            attn_scores = attn_scores.masked_fill(key_padding_mask.to(torch.bool).unsqueeze(1), MASKED_SCORE)
        return attn_scores.softmax(dim=-1)


class SelfAttention(nn.Module):
    """Values weighted by precomputed attention probabilities, then projected back."""

    def __init__(self, embed_dim: int, num_heads: int, value_head_dim: int):
        super().__init__()
        self.in_proj = layers.Linear(embed_dim, num_heads * value_head_dim)
        self.out_proj = layers.Linear(num_heads * value_head_dim, embed_dim)

    def forward(self, x: torch.Tensor, attn_weights: torch.Tensor) -> torch.Tensor:
        seq_len, batch, _ = x.shape
        heads = attn_weights.shape[0]
        v = self.in_proj(x).reshape(seq_len, batch, heads, -1).permute(2, 1, 0, 3)
        x = torch.matmul(attn_weights, v)
        return self.out_proj(x.permute(2, 1, 0, 3).reshape(seq_len, batch, -1))


class FeedforwardModule(nn.Module):
    """Linear → SwooshL → linear."""

    def __init__(self, embed_dim: int, feedforward_dim: int):
        super().__init__()
        self.in_proj = layers.Linear(embed_dim, feedforward_dim)
        self.out_proj = ActivationDropoutAndLinear(feedforward_dim, embed_dim, "SwooshL")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.in_proj(x))


class NonlinAttention(nn.Module):
    """``out_proj(attn(tanh(s) * x) * y)`` with (s, x, y) the three chunks of one projection and the
    attention probabilities of the layer's first head.  The tanh gates one third of a GEMM output,
    so it is a standalone module rather than an epilogue."""

    def __init__(self, channels: int, hidden_channels: int):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.in_proj = layers.Linear(channels, hidden_channels * 3)
        self.tanh = layers.Tanh()
        self.out_proj = layers.Linear(hidden_channels, channels)

    def gate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, B, C) → (tanh(s) * x, y), each (T, B, hidden)."""
        s, x, y = self.in_proj(x).chunk(3, dim=2)
        return x * self.tanh(s), y

    def forward(self, x: torch.Tensor, attn_weights: torch.Tensor) -> torch.Tensor:
        seq_len, batch, _ = x.shape
        x, y = self.gate(x)
        heads = attn_weights.shape[0]
        x = x.reshape(seq_len, batch, heads, -1).permute(2, 1, 0, 3)
        x = torch.matmul(attn_weights, x).permute(2, 1, 0, 3).reshape(seq_len, batch, -1)
        return self.out_proj(x * y)


class ConvolutionModule(nn.Module):
    """Linear → sigmoid gate → depthwise conv (chunk-causal on causal releases) → SwooshR → linear."""

    def __init__(self, channels: int, kernel_size: int, causal: bool):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"cnn_module_kernel must be odd, got {kernel_size}")
        self.causal = causal
        self.in_proj = layers.Linear(channels, 2 * channels)
        self.sigmoid = layers.Sigmoid()
        self.depthwise_conv = (ChunkCausalDepthwiseConv1d(channels, kernel_size) if causal else
                               layers.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2,
                                             groups=channels))
        self.out_proj = ActivationDropoutAndLinear(channels, channels, "SwooshR")

    def gate(self, x: torch.Tensor, src_key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """(T, B, C) → gated (B, C, T), zero on padded frames."""
        x, s = self.in_proj(x).chunk(2, dim=2)
        x = (x * self.sigmoid(s)).permute(1, 2, 0)
        if src_key_padding_mask is not None:
            x = x.masked_fill(src_key_padding_mask.to(torch.bool).unsqueeze(1), 0.0)
        return x

    def forward(self, x: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None,
                chunk_size: int = -1) -> torch.Tensor:
        x = self.gate(x, src_key_padding_mask)
        if self.causal:
            x = self.depthwise_conv(x, chunk_size=chunk_size)
        else:
            x = self.depthwise_conv.forward_bct(x)
        return self.out_proj(x.permute(2, 0, 1))


class Zipformer2EncoderLayer(nn.Module):
    """One Zipformer2 layer: FF1, NonlinAttention, SelfAttention1, Conv1, FF2, mid bypass,
    SelfAttention2, Conv2, FF3, BiasNorm, bypass — all sharing one set of attention weights."""

    def __init__(self, embed_dim: int, pos_dim: int, num_heads: int, query_head_dim: int, pos_head_dim: int,
                 value_head_dim: int, feedforward_dim: int, cnn_module_kernel: int = 31, causal: bool = False):
        super().__init__()
        self.embed_dim = embed_dim
        self.bypass = BypassModule(embed_dim)
        self.bypass_mid = BypassModule(embed_dim)
        self.self_attn_weights = RelPositionMultiheadAttentionWeights(embed_dim, pos_dim, num_heads, query_head_dim,
                                                                      pos_head_dim)
        self.self_attn1 = SelfAttention(embed_dim, num_heads, value_head_dim)
        self.self_attn2 = SelfAttention(embed_dim, num_heads, value_head_dim)
        self.feed_forward1 = FeedforwardModule(embed_dim, (feedforward_dim * 3) // 4)
        self.feed_forward2 = FeedforwardModule(embed_dim, feedforward_dim)
        self.feed_forward3 = FeedforwardModule(embed_dim, (feedforward_dim * 5) // 4)
        self.nonlin_attention = NonlinAttention(embed_dim, hidden_channels=3 * embed_dim // 4)
        self.conv_module1 = ConvolutionModule(embed_dim, cnn_module_kernel, causal=causal)
        self.conv_module2 = ConvolutionModule(embed_dim, cnn_module_kernel, causal=causal)
        # saved by icefall, unused by its forward (the bypasses carry their own scales)
        self.bypass_scale = nn.Parameter(torch.full((embed_dim,), 0.5))
        self.norm = BiasNorm(embed_dim)

    def forward(self, src: torch.Tensor, pos_emb: torch.Tensor, chunk_size: int = -1,
                attn_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        src_orig = src
        attn_weights = self.self_attn_weights(src, pos_emb=pos_emb, attn_mask=attn_mask,
                                              key_padding_mask=src_key_padding_mask)
        src = src + self.feed_forward1(src)
        src = src + self.nonlin_attention(src, attn_weights[0:1])
        src = src + self.self_attn1(src, attn_weights)
        src = src + self.conv_module1(src, chunk_size=chunk_size, src_key_padding_mask=src_key_padding_mask)
        src = src + self.feed_forward2(src)
        src = self.bypass_mid(src_orig, src)
        src = src + self.self_attn2(src, attn_weights)
        src = src + self.conv_module2(src, chunk_size=chunk_size, src_key_padding_mask=src_key_padding_mask)
        src = src + self.feed_forward3(src)
        src = self.norm(src)
        return self.bypass(src_orig, src)


class Zipformer2Encoder(nn.Module):
    """A stack of layers at one frame rate, sharing one positional table."""

    def __init__(self, encoder_layer_args: dict, num_layers: int, pos_dim: int):
        super().__init__()
        self.encoder_pos = CompactRelPositionalEncoding(pos_dim)
        self.layers = nn.ModuleList([Zipformer2EncoderLayer(**encoder_layer_args) for _ in range(num_layers)])
        self.num_layers = num_layers

    def forward(self, src: torch.Tensor, chunk_size: int = -1, attn_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        pos_emb = self.encoder_pos(src)
        for mod in self.layers:
            src = mod(src, pos_emb, chunk_size=chunk_size, attn_mask=attn_mask,
                      src_key_padding_mask=src_key_padding_mask)
        return src


class DownsampledZipformer2Encoder(nn.Module):
    """A stack run at 1/``downsample`` of the frame rate, upsampled back and bypass-combined with
    its input."""

    def __init__(self, encoder: Zipformer2Encoder, dim: int, downsample: int):
        super().__init__()
        self.downsample_factor = downsample
        self.downsample = SimpleDownsample(downsample)
        self.num_layers = encoder.num_layers
        self.encoder = encoder
        self.upsample = SimpleUpsample(downsample)
        self.out_combiner = BypassModule(dim)

    def forward(self, src: torch.Tensor, chunk_size: int = -1, attn_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        src_orig = src
        ds = self.downsample_factor
        src = self.downsample(src)
        if attn_mask is not None:
            attn_mask = attn_mask[::ds, ::ds]
        src = self.encoder(src, chunk_size=chunk_size // ds, attn_mask=attn_mask,
                           src_key_padding_mask=src_key_padding_mask)
        src = self.upsample(src)[: src_orig.shape[0]]
        return self.out_combiner(src_orig, src)


class Zipformer2(nn.Module):
    """The stacks, the full-dimension output assembly and the output downsampling (×2)."""

    def __init__(self, config: ZipformerEncoderConfig):
        super().__init__()
        self.config = config
        self.downsampling_factor = config.downsampling_factor
        self.encoder_dim = config.encoder_dim
        self.causal = config.causal
        self.cnn_module_kernel = config.cnn_module_kernel
        encoders: list[nn.Module] = []
        for i, ds in enumerate(config.downsampling_factor):
            args = dict(embed_dim=config.encoder_dim[i], pos_dim=config.pos_dim, num_heads=config.num_heads[i],
                        query_head_dim=config.query_head_dim[i], pos_head_dim=config.pos_head_dim[i],
                        value_head_dim=config.value_head_dim[i], feedforward_dim=config.feedforward_dim[i],
                        cnn_module_kernel=config.cnn_module_kernel[i], causal=config.causal)
            encoder: nn.Module = Zipformer2Encoder(args, config.num_encoder_layers[i], config.pos_dim)
            if ds != 1:
                encoder = DownsampledZipformer2Encoder(encoder, config.encoder_dim[i], ds)
            encoders.append(encoder)
        self.encoders = nn.ModuleList(encoders)
        self.downsample_output = SimpleDownsample(config.output_downsampling_factor)

    def chunk_info(self, chunk_size: int | None = None, left_context_frames: int | None = None) -> tuple[int, int]:
        """(chunk_size, left_context_chunks) of the offline chunk mask; (-1, -1) when not causal."""
        if not self.causal:
            return -1, -1
        chunk = self.config.chunk_size if chunk_size is None else chunk_size
        if chunk <= 0:
            return -1, -1
        left = self.config.left_context_frames if left_context_frames is None else left_context_frames
        return chunk, (max(left // chunk, 1) if left >= 0 else -1)

    def check_chunk_geometry(self, chunk_size: int | None, left_context_frames: int | None) -> None:
        """Refuse an offline chunk-mask geometry icefall refuses (or that this checkpoint cannot use),
        with a :class:`ConfigError` naming the option."""
        if not self.causal:
            for key, value in (("chunk_size", chunk_size), ("left_context_frames", left_context_frames)):
                if value not in (None, -1):
                    raise ConfigError(f"{key}={value}: this Zipformer is not causal (its convolutions see the "
                                      f"whole utterance), so it has no chunk mask to configure", key=key)
            return
        chunk, left_chunks = self.chunk_info(chunk_size, left_context_frames)
        if chunk_size is not None and chunk_size <= 0 and chunk_size != -1:
            raise ConfigError(f"chunk_size must be positive or -1 (no chunk mask), got {chunk_size}", key="chunk_size")
        if chunk <= 0:
            return
        bad = [d for d in self.downsampling_factor if chunk % d]
        if bad:
            raise ConfigError(f"chunk_size={chunk} must be a multiple of every stack's downsampling factor "
                              f"{self.downsampling_factor}", key="chunk_size")
        if left_chunks >= 0:
            need = max((k // 2) * d for k, d in zip(self.cnn_module_kernel, self.downsampling_factor, strict=True))
            if chunk * left_chunks < need:
                raise ConfigError(f"left_context_frames: a left context of {chunk * left_chunks} frames (chunk "
                                  f"{chunk} x {left_chunks} chunks) is shorter than the convolutions' reach of "
                                  f"{need} frames", key="left_context_frames")

    def get_attn_mask(self, seq_len: int, chunk_size: int, left_context_chunks: int,
                      device: torch.device) -> torch.Tensor | None:
        """(T, T) True where a query may not see a key: later chunks and chunks beyond the left
        context (icefall's ``_get_attn_mask``), None without chunking."""
        if chunk_size <= 0:
            return None
        if left_context_chunks < 0:
            left_context_chunks = 1000000
        c = torch.arange(seq_len, device=device) // chunk_size
        return (c > c.unsqueeze(-1)) | (c < c.unsqueeze(-1) - left_context_chunks)

    def get_full_dim_output(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """Each channel from the latest stack that has it (icefall's ``_get_full_dim_output``)."""
        pieces = [outputs[-1]]
        cur = self.encoder_dim[-1]
        for i in range(len(self.encoder_dim) - 2, -1, -1):
            d = self.encoder_dim[i]
            if d > cur:
                pieces.append(outputs[i][..., cur:d])
                cur = d
        return torch.cat(pieces, dim=-1)

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None, *,
                chunk_size: int | None = None, left_context_frames: int | None = None,
                stack_outputs: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, B, C) embed frames → ((T+1)//2, B, max(encoder_dim)), lengths.  A list passed as
        ``stack_outputs`` receives each stack's (T, B, dim) output."""
        chunk, left_chunks = self.chunk_info(chunk_size, left_context_frames)
        attn_mask = self.get_attn_mask(x.shape[0], chunk, left_chunks, x.device)
        outputs = []
        for i, module in enumerate(self.encoders):
            ds = self.downsampling_factor[i]
            x = convert_num_channels(x, self.encoder_dim[i])
            x = module(x, chunk_size=chunk, attn_mask=attn_mask,
                       src_key_padding_mask=None if src_key_padding_mask is None else src_key_padding_mask[..., ::ds])
            outputs.append(x)
        if stack_outputs is not None:
            stack_outputs.extend(outputs)
        x = self.downsample_output(self.get_full_dim_output(outputs))
        return x, (x_lens + 1) // 2


def make_pad_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, max_len) True on padded positions."""
    return torch.arange(max_len, device=lengths.device) >= lengths.unsqueeze(-1)


class ZipformerEncoderModel(ZipformerStreaming, BaseEncoder):
    """The OASR encoder: ``encoder_embed`` (Conv2dSubsampling) + ``encoder`` (Zipformer2).

    Features beyond each row's length are refilled with icefall's LOG_EPS = log(1e-10) before the
    embed, so a batch is what icefall's own padded batch is, whatever the caller padded with.
    """

    subsampling_rate = 4
    #: feature frames the embed consumes beyond its output frames: (T - 7) // 2
    right_context = 7

    def __init__(self, config: ZipformerEncoderConfig):
        super().__init__()
        self.config = config
        self.encoder_embed = Conv2dSubsampling(config.feature_dim, config.encoder_dim[0], *config.embed_channels)
        self.encoder = Zipformer2(config)

    @property
    def output_size(self) -> int:
        return max(self.config.encoder_dim)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, *, chunk_size: int | None = None,
                left_context_frames: int | None = None,
                stack_outputs: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F), (B,) → (B, T', D), (B,).  ``chunk_size`` / ``left_context_frames`` (embed
        frames) override the config's chunk mask geometry of a causal model; -1 turns it off."""
        if feats.shape[1] < MIN_FEATURE_FRAMES:  # too short for one output frame: every row decodes to nothing
            feats = nn.functional.pad(feats, (0, 0, 0, MIN_FEATURE_FRAMES - feats.shape[1]))
        pad = make_pad_mask(feat_lens, feats.shape[1])
        feats = feats.masked_fill(pad.unsqueeze(-1), LOG_EPS)
        x, x_lens = self.encoder_embed(feats, feat_lens)
        x_lens = x_lens.clamp(min=0)
        src_key_padding_mask = make_pad_mask(x_lens, x.shape[1])
        out, lens = self.encoder(x.permute(1, 0, 2), x_lens, src_key_padding_mask, chunk_size=chunk_size,
                                 left_context_frames=left_context_frames, stack_outputs=stack_outputs)
        return out.permute(1, 0, 2), lens

    def embed(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``encoder_embed`` output alone (B, T_embed, encoder_dim[0]), for parity checks."""
        return self.encoder_embed(feats, feat_lens)
