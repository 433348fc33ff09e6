"""Registers the ``toyframe`` architecture and its ``framewise`` decode family, by string."""

from oasr import hookimpl


@hookimpl
def oasr_register_models(register):
    register(
        "toyframe",
        model="oasr_toyfamily.model:ToyFrameModel",
        config="oasr_toyfamily.model:ToyFrameConfig",
        converter="oasr_toyfamily.convert:ToyFrameConverter",
        description="example third-party family: framewise decoding, slot or stateful streaming",
    )


@hookimpl
def oasr_register_decoders(register):
    register("framewise", "oasr_toyfamily.decode:FramewiseStrategy")
