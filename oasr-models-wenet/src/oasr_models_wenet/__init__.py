"""oasr-models-wenet: OASR architectures and converters from the wenet ecosystem."""

__version__ = "0.1.0"
