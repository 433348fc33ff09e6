"""icefall's Zipformer2 (``egs/librispeech/ASR/zipformer``) on the OASR layer waist.

Module and attribute names are icefall's, so checkpoint keys load unchanged below the two top-level
prefixes (``encoder_embed.*`` and ``encoder.*`` live under the OASR encoder module).
"""
