"""Build a Llama-architecture decoder with random weights as ONNX with
external data, for the validation-memory benchmark (scripts/bench_memory.py).

Not run in CI: it needs torch and transformers (``make .venv-ortzoo/.installed``)
and, at the default size (TinyLlama's shape, about 1.1B parameters, 4.4 GB
of fp32 weights), several GB of memory for the export. ``--layers`` and
``--hidden`` make smaller ones to iterate on.

    .venv-ortzoo/bin/python scripts/build_llm.py                 # ~1.1B: models/cache/llm/llama-22x2048
    .venv-ortzoo/bin/python scripts/build_llm.py --layers 4      # ~0.3B: models/cache/llm/llama-4x2048

The model reads ``input_ids`` and ``attention_mask`` (batch x sequence, both
dynamic) and outputs ``logits``; its folder holds ``model.onnx`` and one
data file, ``model.onnx.data``. A folder already built is reused.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(__file__).resolve().parent.parent / "models" / "cache" / "llm"


def build(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int, out: Path) -> Path:
    """Export the decoder to ``out``/model.onnx (+ model.onnx.data); returns the model's path."""
    import onnx
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=2048,
        use_cache=False,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"  # (plain MatMul/Softmax attention: what an export of a hub model holds)
    model = LlamaForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e9:.2f}B parameters, {params * 4 / 1e9:.1f} GB fp32", flush=True)
    ids = torch.randint(0, vocab, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.int64)

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.m = inner

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        raw = Path(scratch) / "raw.onnx"
        start = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(
                Logits(model),
                (ids, mask),
                str(raw),
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}},
                opset_version=17,
                dynamo=False,
            )
        del model
        print(f"exported in {time.perf_counter() - start:.0f} s", flush=True)
        # One data file beside the model, as a user's export folder would hold.
        proto = onnx.load(str(raw))
        staged = Path(scratch) / "out"
        staged.mkdir()
        onnx.save(proto, str(staged / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
        del proto
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out / "model.onnx"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--out", type=Path, default=None, help="folder (default: models/cache/llm/llama-LAYERSxHIDDEN)")
    a = p.parse_args(argv)
    out = a.out or CACHE / f"llama-{a.layers}x{a.hidden}"
    if (out / "model.onnx").is_file():
        print(out / "model.onnx")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    print(build(a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
