"""The token-shard format (docs/data-format.md), its writer command and the per-rank sample reader.

The layout checks read the files with `struct` and numpy as the format document describes them, not
through planner.runtime.data's own parser.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from planner.runtime import data  # noqa: E402
from planner.runtime.data import DataError, SampleReader, TokenShards  # noqa: E402

DOCS = ["hello world", "zürich\nline two", "x"]


def _write(tmp_path, docs=DOCS, name="train", tokenizer="bytes"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    prefix = tmp_path / "out" / name
    assert data.main(["write", "--tokenizer", tokenizer, "--input", str(corpus), "--output", str(prefix)]) == 0
    return prefix


def test_bytes_dataset_matches_the_documented_layout(tmp_path):
    prefix = _write(tmp_path)
    stream = b"".join(d.encode("utf-8") + b"\x00" for d in DOCS)  # UTF-8 bytes, each document ends with 0
    tokens = np.fromfile(f"{prefix}.bin", dtype="<u2")
    assert tokens.tolist() == list(stream)
    raw = (tmp_path / "out" / "train.idx").read_bytes()
    magic, version, width, vocab, eos, docs, count, name_len = struct.unpack_from("<8sIIQqQQI", raw)
    assert (magic, version, width, vocab, eos, docs, count) == (b"PLNRTOK\x00", 1, 2, 256, 0, 3, len(stream))
    name_end = struct.calcsize("<8sIIQqQQI") + name_len
    assert raw[name_end - name_len:name_end] == b"bytes"
    start = name_end + (-name_end % 8)
    offsets = np.frombuffer(raw, dtype="<u8", offset=start).tolist()
    lengths = [len(d.encode("utf-8")) + 1 for d in DOCS]
    assert offsets == [0, lengths[0], lengths[0] + lengths[1], sum(lengths)]
    shards = TokenShards(prefix)
    assert bytes(shards.document(1)[:-1].tolist()).decode("utf-8") == DOCS[1]


def test_writer_is_deterministic_and_accepts_plain_text_files(tmp_path):
    first, second = _write(tmp_path / "a"), _write(tmp_path / "b")
    for suffix in (".bin", ".idx"):
        assert Path(f"{first}{suffix}").read_bytes() == Path(f"{second}{suffix}").read_bytes()
    text = tmp_path / "book.txt"
    text.write_text("one file is one document", encoding="utf-8")
    prefix = tmp_path / "book"
    assert data.main(["write", "--tokenizer", "bytes", "--input", str(text), "--output", str(prefix)]) == 0
    assert TokenShards(prefix).header.documents == 1


def _stream_reader(prefix, **kw):
    defaults = {"seq_len": 4, "global_batch": 4, "dp_rank": 0, "dp_size": 1, "seed": 3}
    return SampleReader(TokenShards(prefix), **{**defaults, **kw})


def test_samples_are_windows_of_the_stream_in_a_permuted_order(tmp_path):
    prefix = _write(tmp_path)
    stream = np.fromfile(f"{prefix}.bin", dtype="<u2").astype(np.int64)
    reader = _stream_reader(prefix)
    n = (len(stream) - 1) // 4
    assert reader.samples == n
    order = [reader.sample_index(p) for p in range(n)]
    assert sorted(order) == list(range(n))  # an epoch visits every sample once
    assert [reader.sample_index(p) for p in range(n, 2 * n)] != order  # the next epoch in another order
    tokens, labels = reader.next_batch()
    for row in range(4):
        start = order[row] * 4
        assert tokens[row].tolist() == stream[start:start + 4].tolist()
        assert labels[row].tolist() == stream[start + 1:start + 5].tolist()


def test_data_parallel_ranks_split_the_global_batch(tmp_path):
    prefix = _write(tmp_path)
    whole = _stream_reader(prefix)
    ranks = [_stream_reader(prefix, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(3):
        tokens, labels = whole.next_batch()
        parts = [reader.next_batch() for reader in ranks]
        assert [p[0].shape[0] for p in parts] == [2, 2]
        assert tokens.tolist() == parts[0][0].tolist() + parts[1][0].tolist()
        assert labels.tolist() == parts[0][1].tolist() + parts[1][1].tolist()
    assert whole.position == ranks[0].position == ranks[1].position == 12


def test_reader_resumes_from_its_position(tmp_path):
    prefix = _write(tmp_path)
    straight = _stream_reader(prefix)
    batches = [straight.next_batch()[0].tolist() for _ in range(5)]
    stopped = _stream_reader(prefix)
    stopped.next_batch()
    stopped.next_batch()
    resumed = _stream_reader(prefix)
    resumed.load_state_dict(stopped.state_dict())
    assert [resumed.next_batch()[0].tolist() for _ in range(3)] == batches[2:]


def test_hugging_face_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3, "x": 4}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    prefix = _write(tmp_path, docs=["hello world", "x hello"], tokenizer=str(path))
    assert np.fromfile(f"{prefix}.bin", dtype="<u2").tolist() == [2, 3, 1, 4, 2, 1]  # </s> ends each document
    header = TokenShards(prefix).header
    assert (header.vocab_size, header.eos_id, header.tokenizer) == (5, 1, str(path))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.runtime.data", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_errors_are_one_line_naming_file_and_field(tmp_path):
    missing = _cli("write", "--tokenizer", "bytes", "--input", str(tmp_path / "nope.txt"), "--output",
                   str(tmp_path / "x"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nope.txt: --input: no such file" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n', encoding="utf-8")
    run = _cli("write", "--tokenizer", "bytes", "--input", str(bad), "--output", str(tmp_path / "x"))
    assert run.returncode == 2 and "bad.jsonl:2: text: missing or not a string" in run.stderr
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "x.bin.tmp").exists()  # nothing half-written


def test_reader_names_the_file_and_field_of_a_broken_dataset(tmp_path):
    prefix = _write(tmp_path)
    idx = tmp_path / "out" / "train.idx"
    good = idx.read_bytes()
    idx.write_bytes(b"NOTATOKN" + good[8:])
    with pytest.raises(DataError, match=r"train\.idx: magic"):
        TokenShards(prefix)
    idx.write_bytes(good)
    with open(f"{prefix}.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(DataError, match=r"train\.bin: tokens"):
        TokenShards(prefix)
    with pytest.raises(DataError, match="no such file"):
        TokenShards(tmp_path / "absent")


def test_a_token_id_beyond_the_vocabulary_stops_every_rank_at_the_same_step(tmp_path):
    # issue #26: an id the tokenizer does not have would index past the embedding (a device assert on a GPU)
    prefix = _write(tmp_path)
    tokens = np.fromfile(f"{prefix}.bin", dtype="<u2")
    tokens[5] = 256  # the bytes tokenizer has 256 ids
    tokens.tofile(f"{prefix}.bin")
    ranks = [_stream_reader(prefix, dp_rank=r, dp_size=2) for r in range(2)]
    whole = _stream_reader(prefix)
    steps = []
    for reader in (*ranks, whole):
        for step in range(20):  # the samples visit every token within an epoch
            try:
                reader.next_batch()
            except DataError as err:
                assert "train.bin: token 5: id 256 is not below the vocabulary size 256" in str(err)
                steps.append(step)
                break
    assert len(steps) == 3 and len(set(steps)) == 1, steps  # each rank checks the whole global batch


def test_the_writer_refuses_an_output_that_names_no_files(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("hello", encoding="utf-8")
    for output in ("", str(tmp_path) + "/", str(tmp_path), "."):
        run = _cli("write", "--tokenizer", "bytes", "--input", str(text), "--output", output)
        assert run.returncode == 2 and "--output" in run.stderr and "name the files" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"] and not Path("..bin").exists()
