"""oasr-kernels: accelerated kernels for OASR, registered through the ``oasr.kernels`` entry point."""

__version__ = "0.1.0"
