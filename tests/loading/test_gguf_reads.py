"""Transformers' GGUF conversion parses the file once: one `gguf` reader per file and one name map per
architecture and layer count inside `gguf_parsed_once()`, and the `gguf` module as it was afterwards."""

import gguf

from vriksha.loading.gguf_reads import gguf_parsed_once
from vriksha.loading.loader import default_gguf_path


def test_one_reader_per_file_inside_the_block_and_the_module_restored_after():
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path = default_gguf_path()
    with gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert isinstance(first, reader_class)
        assert first.fields["general.architecture"].contents() == "llama"
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
        assert gguf.get_tensor_name_map(arch, 2) is not gguf.get_tensor_name_map(arch, 30)
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not first


def test_the_module_is_restored_when_the_conversion_fails():
    reader_class = gguf.GGUFReader
    try:
        with gguf_parsed_once():
            raise ValueError("conversion failed")
    except ValueError:
        pass
    assert gguf.GGUFReader is reader_class
