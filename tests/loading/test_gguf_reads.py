"""Transformers' GGUF conversion parses the file once: one `gguf` reader per file and one name map per
architecture and layer count inside `gguf_parsed_once()`, and the `gguf` module as it was afterwards."""

import numpy as np
import pytest

from vriksha.loading.gguf_reads import gguf_parsed_once

gguf = pytest.importorskip("gguf")


def _tiny_gguf(path) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100)])
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_one_reader_per_file_inside_the_block_and_the_module_restored_after(tmp_path):
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path, other = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _tiny_gguf(path)
    _tiny_gguf(other)
    with gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert gguf.GGUFReader(other) is not first
        assert isinstance(first, reader_class)
        assert first.fields["general.architecture"].contents() == "llama"
        assert len(first.fields["tokenizer.ggml.tokens"].contents()) == 100
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.get_tensor_name_map(arch, 2) is not gguf.get_tensor_name_map(arch, 30)
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not first


def test_the_module_is_restored_when_the_conversion_fails():
    reader_class = gguf.GGUFReader
    with pytest.raises(ValueError, match="conversion failed"), gguf_parsed_once():
        raise ValueError("conversion failed")
    assert gguf.GGUFReader is reader_class
