"""Sentences as vectors for a search by meaning: all-MiniLM-L6-v2 (a 6-layer BERT,
384 dimensions) run with numpy alone: its tokenizer through ``tokenizers``, its weights
read from the catalog's safetensors file, mean pooling and L2 normalisation, as
sentence-transformers computes it (checked against its published similarities in
tests/test_search_meaning.py)."""

# numpy, not torch: torch is not installable on every node, and one small BERT needs no
# more than a few matrix products. (MLX would run the same arithmetic on Apple silicon;
# mlx-cpu on Linux took 132 ms of CPU for the 640x384x1536 product numpy does in 8 ms.)

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import weights

MODEL = "all-minilm-l6-v2"  # the catalog entry
BACKEND = "numpy"
DIMENSIONS = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
BATCH = 32  # sentences a forward pass; sorted by length first, so little padding
BATCH_TOKENS = 2048  # at most this many tokens a forward pass (sentences x the longest)


class MeaningUnavailable(Exception):
    """The model for a search by meaning is not in place; the message says what to do."""


class Encoder:
    """The model, loaded from its folder (never fetched)."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        # Dense weights transposed once, so each product is one contiguous matrix product.
        self.w = {
            k: np.ascontiguousarray(
                v.T if k.endswith(".weight") and ("dense" in k or ".self." in k) else v,
                np.float32,
            )
            for k, v in load_file(str(folder / "model.safetensors")).items()
        }
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()

    def encode(self, texts: list[str]) -> np.ndarray:
        """One unit vector (float32, DIMENSIONS) a text, in the order given."""
        out = np.zeros((len(texts), DIMENSIONS), np.float32)
        encoded = self.tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        while order:
            # As many as fit BATCH_TOKENS at the longest's width: a batch of long texts
            # would otherwise need hundreds of MB for its attention scores.
            width = len(encoded[order[0]].ids)
            size = 1
            while size < min(BATCH, len(order)):
                wider = len(encoded[order[size]].ids)
                if (size + 1) * wider > BATCH_TOKENS:
                    break
                width, size = wider, size + 1
            batch, order = order[:size], order[size:]
            ids = np.zeros((len(batch), width), np.int64)
            mask = np.zeros((len(batch), width), np.float32)
            for row, i in enumerate(batch):
                n = len(encoded[i].ids)
                ids[row, :n] = encoded[i].ids
                mask[row, :n] = 1.0
            out[batch] = self._forward(ids, mask)
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self.w
        n, width = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:width][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        heads, size = self.heads, x.shape[-1] // self.heads
        blocked = (1.0 - mask)[:, None, None, :] * -1e9  # padding gets no attention
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."
            q, k, v = (
                self._dense(x, p + f"attention.self.{part}")
                .reshape(n, width, heads, size)
                .transpose(0, 2, 1, 3)
                for part in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size) + blocked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, width, heads * size)
            x = self._norm(
                x + self._dense(context, p + "attention.output.dense"),
                p + "attention.output.LayerNorm",
            )
            inner = _gelu(self._dense(x, p + "intermediate.dense"))
            x = self._norm(x + self._dense(inner, p + "output.dense"), p + "output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1]) @ self.w[name + ".weight"]  # one product
        return (flat + self.w[name + ".bias"]).reshape(*x.shape[:-1], -1)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[
            name + ".bias"
        ]


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's gelu, the exact (erf) one, not the tanh approximation."""
    return 0.5 * x * (1.0 + _erf(x * np.float32(1 / np.sqrt(2.0))))


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26: within 1.5e-7 of erf, below float32's own precision
    # (numpy has no erf, and scipy is not worth a dependency for one function).
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return sign * (1.0 - poly * np.exp(-a * a))


_loaded: dict[Path, Encoder] = {}
_lock = threading.Lock()


def spec() -> weights.ModelSpec:
    try:
        found = weights.load_catalog().find(MODEL, BACKEND)
    except weights.ModelError as exc:
        raise MeaningUnavailable(str(exc)) from None
    if found is None:
        raise MeaningUnavailable(f"no model {MODEL} in the model catalog")
    return found


def folder(models_dir: Path | None = None) -> Path:
    """Where the model is, ready; MeaningUnavailable saying how to put it there if not."""
    model = spec()
    root = weights.models_root() if models_dir is None else models_dir
    state = weights.state(model, root)
    if not state.ready:
        raise MeaningUnavailable(
            f"search by meaning needs the model {model.name}, which is not in place "
            f"({state.reason}): run `pip install 'momentry-edge[meaning]'` and "
            f"`{weights.pull_command(model, root)}`, then search again"
        )
    return weights.model_dir(model, root)


def available(models_dir: Path | None = None) -> bool:
    try:
        folder(models_dir)
    except MeaningUnavailable:
        return False
    return True


def load(models_dir: Path | None = None) -> Encoder:
    """The model, loaded once per process on first use."""
    where = folder(models_dir)
    with _lock:
        if where not in _loaded:
            try:
                _loaded[where] = Encoder(where)
            except ImportError as exc:
                raise MeaningUnavailable(
                    f"search by meaning needs {exc.name}: "
                    "run `pip install 'momentry-edge[meaning]'`"
                ) from None
        return _loaded[where]


def as_blob(vectors: np.ndarray) -> list[bytes]:
    """Vectors as stored: float16, little-endian (768 bytes each)."""
    return [v.astype("<f2").tobytes() for v in vectors]


def from_blobs(blobs: list[Any]) -> np.ndarray:
    return np.frombuffer(b"".join(bytes(b) for b in blobs), "<f2").reshape(-1, DIMENSIONS)
