"""The FastConformer family (NeMo Parakeet CTC / RNN-T / TDT in the Hugging Face layout)."""
