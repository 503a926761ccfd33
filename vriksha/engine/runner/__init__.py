"""The model runner: the engine's load (`load.py`), the flattened batch of a step (`step_builder.py`), and the
forward paths behind one protocol (`forward_path.py`), assembled once at load into an ordered chain."""
