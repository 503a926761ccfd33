"""The engine's attention: one backend interface (`backend.py`), a backend per kernel set and KV pool dtype
chosen once at load, and the function Transformers' layers call (`paged.py`), which writes each layer's new
K/V into the pool and hands the rest to the batch's backend."""
