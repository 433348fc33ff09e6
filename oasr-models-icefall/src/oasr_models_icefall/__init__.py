"""oasr-models-icefall: OASR architectures and converters from the icefall ecosystem."""

__version__ = "0.1.0"
