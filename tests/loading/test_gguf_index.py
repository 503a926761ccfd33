"""The GGUF tensor table read without the `gguf` package's reader: the same tensors, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from vriksha.errors import ModelLoadError
from vriksha.loading.gguf_index import read_gguf_index

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _write(path, alignment: int | None = None) -> None:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_head_count(4)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("nested", [[1, 2], [3]])
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_tensor(
        "blk.0.attn_q.weight",
        gguf.quants.quantize(rng.normal(size=(64, 64)).astype(np.float32), Q.Q4_1),
        raw_dtype=Q.Q4_1,
    )
    writer.add_tensor("blk.0.attn_norm.weight", rng.normal(size=(64,)).astype(np.float32))
    writer.add_tensor(
        "blk.0.ffn_down.weight",
        gguf.quants.quantize(rng.normal(size=(32, 96)).astype(np.float32), Q.Q8_0),
        raw_dtype=Q.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_tensor_table_equals_the_gguf_readers(tmp_path, alignment):
    path = tmp_path / "m.gguf"
    _write(path, alignment)
    reference = gguf.GGUFReader(str(path))
    index = read_gguf_index(path)
    assert [t.name for t in index.tensors] == [t.name for t in reference.tensors]
    for ours, theirs in zip(index.tensors, reference.tensors, strict=True):
        assert ours.type_name == theirs.tensor_type.name
        assert ours.shape == tuple(int(n) for n in theirs.shape)
        assert np.array_equal(ours.data, np.asarray(theirs.data).view(np.uint8).reshape(-1))
    assert index.metadata["general.architecture"] == "llama"
    assert index.metadata["general.name"] == "tiny"
    assert index.metadata["llama.attention.head_count"] == 4
    assert "tokenizer.ggml.tokens" not in index.metadata  # arrays are skipped, not decoded


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        read_gguf_index(path)


def test_a_truncated_file_names_what_ran_out(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 100])
    with pytest.raises(ModelLoadError, match="runs past the end"):
        read_gguf_index(path)
    path.write_bytes(whole[:40])
    with pytest.raises(ModelLoadError, match="GGUF"):
        read_gguf_index(path)
