"""CUDA kernels (numba.cuda) for OASR's GPU path, registered as the ``@cuda`` variants of kernel slots.

Core picks a slot's ``name@cuda`` variant when the tensor it works on lives on a CUDA device
(:func:`oasr.layers._backend.kernel` with a device); on the CPU nothing here is imported.

| slot | module | what runs on the device |
|---|---|---|
| ``stft_mel@cuda`` | :mod:`.features` | framing (dither, DC removal, pre-emphasis, window) → torch's cuFFT → power spectrum, sparse mel projection and log (→ DCT/lifter for MFCC) |
| ``ctc_greedy_search@cuda`` | :mod:`.ctc` | argmax (torch) → run-length collapse, one thread per utterance |
| ``ctc_prefix_beam_search@cuda`` | :mod:`.beam` | WeNet's prefix beam search, one block per utterance |
| ``transducer_greedy_search@cuda`` | :mod:`.transducer` | batched greedy transducer search over a :class:`~.transducer.TransducerStep` |

Tensors reach the kernels through ``__cuda_array_interface__`` (``numba.cuda.as_cuda_array``): no
host copies, launched on torch's current stream.  Under the numba CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) the same kernels run in Python threads on host memory: the wrappers
then take CPU tensors and hand the kernels numpy views of them (also without copies).  Tests check
every kernel against its CPU reference that way; see :mod:`._runtime`.
"""
