"""Write an F32 GGUF holding exactly the weights vriksha runs, for a like-for-like llama.cpp comparison.

vriksha loads the embedded SmolLM2-135M-Instruct Q4_1 GGUF by dequantising it through Transformers
(gguf.quants.dequantize) to fp32, so it never runs the quantised kernels. Benchmarking llama.cpp on the
Q4_1 file would compare different arithmetic on different numbers; this script dequantises every
tensor with the same function and writes an all-F32 GGUF, keeping every metadata key (tokenizer, chat
template, hyper-parameters) except the bookkeeping GGUFWriter manages itself. general.file_type becomes
ALL_F32 (0).

    python benchmarks/make_f32_gguf.py                 # embedded model -> ~/.cache/vriksha/...F32.gguf
    python benchmarks/make_f32_gguf.py --check         # also: load it in llama-cpp-python and compare its
                                                       # greedy tokens with vriksha's on three chat prompts
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

# Keys GGUFWriter writes itself (header counts, architecture, alignment) or that this script sets.
SKIP_KEYS = {"general.architecture", "general.alignment", "general.file_type"}
DEFAULT_OUTPUT = Path("~/.cache/vriksha/SmolLM2-135M-Instruct.F32.gguf").expanduser()


def embedded_gguf() -> Path:
    from vriksha.loading.loader import default_gguf_path

    return default_gguf_path()


def copy_metadata(reader, writer) -> int:
    """Copy every key/value but the writer-managed ones; returns how many were copied."""
    from gguf import GGUFValueType

    n = 0
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in SKIP_KEYS:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
        n += 1
    return n


def convert(src: Path, dst: Path) -> None:
    from gguf import GGUFReader, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".partial")
    writer = GGUFWriter(tmp, arch)
    n_keys = copy_metadata(reader, writer)
    writer.add_file_type(LlamaFileType.ALL_F32)
    for t in reader.tensors:
        # GGUF shapes are innermost-first; numpy's are outermost-first.
        shape = tuple(int(d) for d in reversed(t.shape))
        data = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    print(
        f"wrote {dst} ({dst.stat().st_size / 2**20:.0f} MiB): {len(reader.tensors)} tensors, {n_keys} metadata keys"
    )


CHECK_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
]


def check(dst: Path, max_tokens: int) -> bool:
    """Greedy-decode chat prompts in vriksha and in llama-cpp-python; True when every token agrees."""
    from llama_cpp import Llama

    from vriksha import LLM, SamplingParams

    llm = LLM()
    lc = Llama(model_path=str(dst), n_ctx=1024, n_threads=2, verbose=False)
    all_same = True
    for text in CHECK_PROMPTS:
        ids = llm.apply_chat_template([{"role": "user", "content": text}])
        out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=max_tokens, temperature=0))
        ours = list(out[0].outputs[0].token_ids)
        theirs: list[int] = []
        for tok in lc.generate(ids, temp=0.0, top_k=1, reset=True):
            theirs.append(tok)
            if len(theirs) >= len(ours):
                break
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), len(ours))
        all_same &= agree == len(ours)
        print(f"{text!r} ({len(ids)} prompt tokens): first {agree} of {len(ours)} greedy tokens agree")
        print(f"  vriksha  : {ours}\n             {llm.tokenizer.decode(ours)!r}")
        if theirs != ours:
            print(f"  llama.cpp: {theirs}\n             {llm.tokenizer.decode(theirs)!r}")
    print("greedy tokens: " + ("all match" if all_same else "MISMATCH"))
    return all_same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path, default=None, help="source GGUF (default: the embedded Q4_1 model)")
    ap.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help=f"F32 GGUF to write (default: {DEFAULT_OUTPUT})"
    )
    ap.add_argument("--check", action="store_true", help="compare greedy tokens with vriksha after writing")
    ap.add_argument(
        "--check-only", action="store_true", help="skip writing; only run the comparison on --output"
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    args = ap.parse_args()
    if not args.check_only:
        convert(args.input or embedded_gguf(), args.output.expanduser())
    if args.check or args.check_only:
        raise SystemExit(0 if check(args.output.expanduser(), args.max_tokens) else 1)


if __name__ == "__main__":
    main()
