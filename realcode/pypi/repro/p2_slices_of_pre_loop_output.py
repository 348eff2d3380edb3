# TGL102 FP (backpack example_retain_graph.py:306): `reconstruction = model(X)` is computed once before the
# loop; each chunk's loss slices it, so every backward goes through the shared forward graph.
import torch
from torch import nn


def diag_ggn_multiple_passes(model, X, loss_func, num_chunks):
    reconstruction = model(X)
    chunk_size = reconstruction.shape[1] // num_chunks
    for idx in range(num_chunks):
        slicing = (slice(None), slice(idx * chunk_size, (idx + 1) * chunk_size))
        chunk_module = Slicing(slicing)
        sliced_reconstruction = chunk_module(reconstruction)
        slice_error = loss_func(sliced_reconstruction, X[slicing])
        slice_error.backward(retain_graph=True)          # TGL102 reported
