"""LoRA: the adapter record and PEFT's directory format (`adapter.py`), shared by training, export, weight
transfer and serving."""

from vriksha.lora.adapter import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    LoraAdapter,
    LoraWeights,
    load_peft_dir,
    parse_peft_key,
    peft_key,
    save_peft_dir,
)

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "AdapterError",
    "LoraAdapter",
    "LoraWeights",
    "load_peft_dir",
    "parse_peft_key",
    "peft_key",
    "save_peft_dir",
]
