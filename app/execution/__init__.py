"""Running forwards: everything between "these rows need these positions" and "here are their
logits (and taps)".

A model's runner and its KV cache (`runner.py`), the forwards that batch rows of one model in one
call (`forward.py`), the step protocol by which a row asks for them and the rows' steps are served
alone or together (`steps.py`), the prompt cache beside the caches (`prompt_cache.py`), the hidden
states drafters read out of a target's forward (`target_taps.py`), loading a checkpoint onto the
device (`model.py`), what the device decides (`device.py`), the GPU's row-invariant kernels
(`row_invariant.py`), a tensor-parallel target (`tensor_parallel.py`, `lockstep.py`), the
streams engine threads compute on (`streams.py`).

Modules import MLX; import them directly (this package's own import loads nothing).
"""
