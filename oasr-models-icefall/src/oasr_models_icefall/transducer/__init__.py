"""The ``transducer`` architecture: icefall's stateless-predictor RNN-T over a Zipformer encoder."""
