"""oasr-models-hf: OASR architectures and converters from the hf ecosystem."""

__version__ = "0.1.0"
