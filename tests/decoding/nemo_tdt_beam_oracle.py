"""NeMo's side of the TDT beam search parity tests; run in NeMo's own venv (a subprocess).

``python nemo_tdt_beam_oracle.py IN.pt OUT.pt``: ``IN.pt`` maps case names to specs; a spec holds a TDT
prediction and joint network as
NeMo's own ``RNNTDecoder`` / ``RNNTJoint`` state dicts (``decoder``, ``joint``), their sizes (``vocab``: token
logits with the blank last, ``pred_hidden``, ``pred_layers``, ``enc_hidden``, ``joint_hidden``,
``activation``, ``durations``), encoder outputs (``encoder``: a list of (T, enc_hidden) tensors) and the
searches to run (``runs``: ``[search_type, beam_size]`` pairs).  NeMo's modules are built from the sizes, the
state dicts loaded strictly, and ``BeamTDTInfer`` (``score_norm`` on, every hypothesis returned) run per
clip.  ``OUT.pt``: ``{case: {"search_type/beam": [per clip: [{"tokens", "score"}, ... best first]]}}``.
"""

from __future__ import annotations

import sys

import torch


def modules(spec: dict):
    from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint

    labels = int(spec["vocab"]) - 1  # NeMo counts its vocabulary without the blank (the last id)
    decoder = RNNTDecoder(prednet={"pred_hidden": spec["pred_hidden"], "pred_rnn_layers": spec["pred_layers"],
                                   "dropout": 0.0}, vocab_size=labels, blank_as_pad=True, normalization_mode=None)
    joint = RNNTJoint(jointnet={"encoder_hidden": spec["enc_hidden"], "pred_hidden": spec["pred_hidden"],
                                "joint_hidden": spec["joint_hidden"], "activation": spec["activation"],
                                "dropout": 0.0},
                      num_classes=labels, num_extra_outputs=len(spec["durations"]), log_softmax=None)
    decoder.load_state_dict(spec["decoder"], strict=True)
    joint.load_state_dict(spec["joint"], strict=True)
    return decoder.eval(), joint.eval()


def main(argv: list[str]) -> int:
    from nemo.collections.asr.parts.submodules.tdt_beam_decoding import BeamTDTInfer

    torch.set_num_threads(1)
    out = {name: run(spec, BeamTDTInfer) for name, spec in torch.load(argv[0], weights_only=True).items()}
    torch.save(out, argv[1])
    return 0


def run(spec: dict, infer_class) -> dict:
    decoder, joint = modules(spec)
    out = {}
    for search_type, beam in spec["runs"]:
        infer = infer_class(decoder, joint, durations=list(spec["durations"]), beam_size=int(beam),
                             search_type=search_type, score_norm=True, return_best_hypothesis=False)
        clips = []
        for enc in spec["encoder"]:
            (nbest,) = infer(encoder_output=enc.T[None].contiguous(), encoded_lengths=torch.tensor([enc.shape[0]]))
            clips.append([{"tokens": [int(t) for t in h.y_sequence.tolist()], "score": float(h.score)}
                          for h in nbest[0].n_best_hypotheses])
        out[f"{search_type}/{beam}"] = clips
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
