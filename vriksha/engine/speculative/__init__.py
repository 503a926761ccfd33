"""Speculative decoding without a draft model: tokens proposed from the sequence itself (`speculative/ngram_proposer.py`),
verified by the model in one forward (`speculator.py`). The scheduler takes a `Speculator` at construction."""
