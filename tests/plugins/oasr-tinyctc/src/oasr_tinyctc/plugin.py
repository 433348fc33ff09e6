"""Registers the ``tinyctc`` architecture by string: importing this module imports no torch code."""

from oasr import hookimpl


@hookimpl
def oasr_register_models(register):
    register(
        "tinyctc",
        model="oasr_tinyctc.model:TinyCtcModel",
        config="oasr_tinyctc.model:TinyCtcConfig",
        converter="oasr_tinyctc.convert:TinyCtcConverter",
        description="example third-party CTC architecture",
    )
