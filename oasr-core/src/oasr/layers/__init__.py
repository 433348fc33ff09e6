"""The layer waist: every architecture is built from these modules, never from bare ``torch.nn``
compute layers, so quantization, kernels and instrumentation reach every model through one seam."""

from oasr.layers.activation import Activation, Gelu, Glu, Relu, Sigmoid, Swish, Tanh, activation_fn
from oasr.layers.attention import Attention, MultiHeadAttention, attend, merge_heads, split_heads
from oasr.layers.conv import Conv1d, Conv2d, DepthwiseConv1d, PointwiseConv1d
from oasr.layers.ctc import CtcProjection
from oasr.layers.embedding import Embedding
from oasr.layers.linear import Linear, LinearActivation
from oasr.layers.mlp import FeedForward, GatedMLP
from oasr.layers.norm import BatchNorm1d, LayerNorm, RMSNorm
from oasr.layers.positional import sinusoid_table
from oasr.layers.recurrent import LSTM
from oasr.layers.rotary import RotaryEmbedding

__all__ = [
    "Activation", "Attention", "BatchNorm1d", "Conv1d", "Conv2d", "CtcProjection", "DepthwiseConv1d",
    "Embedding", "FeedForward", "GatedMLP", "Gelu", "Glu", "LSTM", "LayerNorm", "Linear", "LinearActivation",
    "MultiHeadAttention", "PointwiseConv1d", "RMSNorm", "Relu", "RotaryEmbedding", "Sigmoid", "Swish", "Tanh",
    "activation_fn", "attend", "merge_heads", "sinusoid_table", "split_heads",
]
