"""oasr-models-funasr: OASR architectures and converters from the funasr ecosystem."""

__version__ = "0.1.0"
