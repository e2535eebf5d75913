"""Pre-tokenized training data: memory-mapped token shards, their writer, and a per-rank sample reader.

A dataset is two files with a common path prefix (docs/data-format.md has the byte layout):

* PREFIX.bin: the token ids of every document, one after the other, each document followed by the
  tokenizer's end-of-document id (when it has one), little-endian uint16 (vocabularies up to 65,536 ids)
  or uint32;
* PREFIX.idx: a small header (magic, version, token width, vocabulary size, end-of-document id, the
  tokenizer's name, counts) and the token offset of every document.

`python -m planner.runtime.data write --tokenizer NAME_OR_PATH --input FILE... --output PREFIX` writes
them from text: a `.jsonl` input holds one document per line (the `--json-key` field, default `text`),
any other file is one document.  `--tokenizer bytes` is the built-in byte-level tokenizer (ids 0-255
are UTF-8 bytes; 0, the NUL byte, ends a document); anything else is a Hugging Face tokenizer: a
`tokenizer.json` file (`tokenizers`), or a name or folder `transformers.AutoTokenizer` loads.

`SampleReader` cuts the token stream into samples of seq_len + 1 tokens (GPT-style packing: sample i
starts at token i * seq_len; inputs are its first seq_len tokens, labels its last seq_len) and visits
them in a fixed order per epoch (an affine permutation i -> (a * i + b) mod N, a coprime to N, both
from the seed and the epoch: O(1) memory at any dataset size).  Its position counts the samples the
whole job has consumed; step after step every data-parallel rank takes its own contiguous slice of
the global batch, so the batches do not depend on the layout and the position alone resumes the
stream.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MAGIC = b"PLNRTOK\x00"
VERSION = 1
# magic, version, token width (bytes), vocabulary size, end-of-document id (-1: none), documents,
# tokens, tokenizer name length; the name (UTF-8) follows, zero-padded to a multiple of 8 bytes
_HEADER = struct.Struct("<8sIIQqQQI")
BYTES_TOKENIZER = "bytes"


class DataError(ValueError):
    """A dataset or writer input that cannot be used; the message names the file and the field."""


class ShardHeader(BaseModel):
    """What PREFIX.idx says about PREFIX.bin."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_bytes: int = Field(description="Bytes per token id in PREFIX.bin: 2 (uint16) or 4 (uint32).")
    vocab_size: int = Field(ge=1, description="Size of the tokenizer's vocabulary: every id is below it.")
    eos_id: int = Field(ge=-1, description="Id that ends each document, -1 when the tokenizer has none.")
    tokenizer: str = Field(description="The --tokenizer the dataset was written with.")
    documents: int = Field(ge=0, description="Number of documents.")
    tokens: int = Field(ge=0, description="Number of tokens in PREFIX.bin.")


# ---------------------------------------------------------------- tokenizers


@dataclass(frozen=True)
class TextTokenizer:
    """A tokenizer the writer can use: its name as given, vocabulary size, end-of-document id, encoder."""

    name: str
    vocab_size: int
    eos_id: int
    encode: Callable[[str], list[int]]


def _encode_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def load_tokenizer(name: str) -> TextTokenizer:
    """`bytes`, a tokenizer.json file (Hugging Face `tokenizers`) or a `transformers` name or folder."""
    if name == BYTES_TOKENIZER:
        return TextTokenizer(name, 256, 0, _encode_bytes)
    path = Path(name)
    if path.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DataError(f"--tokenizer {name}: reading a tokenizer.json needs `pip install tokenizers`") from None
        tok = Tokenizer.from_file(str(path))
        eos = next((tok.token_to_id(t) for t in _EOS_NAMES if tok.token_to_id(t) is not None), -1)
        return TextTokenizer(name, tok.get_vocab_size(with_added_tokens=True), eos,
                             lambda text: tok.encode(text, add_special_tokens=False).ids)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(f"--tokenizer {name}: not a file; loading a tokenizer by name needs "
                        "`pip install transformers` (or pass a tokenizer.json, or `bytes`)") from None
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise DataError(f"--tokenizer {name}: {str(err).splitlines()[0]}") from None
    eos = tok.eos_token_id if tok.eos_token_id is not None else -1
    return TextTokenizer(name, len(tok), eos, lambda text: tok.encode(text, add_special_tokens=False))


_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>")


# ---------------------------------------------------------------- writing


def documents(paths: list[Path], json_key: str) -> Iterator[str]:
    """The documents of the inputs, in order: one per line of a .jsonl file, else one per file."""
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: --input: no such file")
        try:
            if path.suffix != ".jsonl":
                yield path.read_text(encoding="utf-8")
            else:
                yield from _jsonl_documents(path, json_key)
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: --input: not UTF-8 text (byte {err.start})") from None


def _jsonl_documents(path: Path, json_key: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not JSON ({err.msg})") from None
            text = record.get(json_key) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DataError(f"{path}:{number}: {json_key}: missing or not a string")
            yield text


def index_bytes(header: ShardHeader, offsets: list[int]) -> bytes:
    """PREFIX.idx: the header, the tokenizer name padded to 8 bytes, then documents + 1 uint64 offsets."""
    name = header.tokenizer.encode("utf-8")
    fixed = _HEADER.pack(MAGIC, VERSION, header.token_bytes, header.vocab_size, header.eos_id, header.documents,
                         header.tokens, len(name))
    pad = b"\x00" * (-(len(fixed) + len(name)) % 8)
    return fixed + name + pad + np.asarray(offsets, dtype="<u8").tobytes()


def write_dataset(texts: Iterator[str], tokenizer: TextTokenizer, prefix: Path) -> ShardHeader:
    """Tokenize `texts` into PREFIX.bin and PREFIX.idx (each written to a temporary name, then renamed)."""
    width = 2 if tokenizer.vocab_size <= 1 << 16 else 4
    dtype = np.dtype("<u2" if width == 2 else "<u4")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    tmp_bin, tmp_idx = Path(f"{bin_path}.tmp"), Path(f"{idx_path}.tmp")
    offsets = [0]
    try:
        with tmp_bin.open("wb") as out:
            for text in texts:
                ids = tokenizer.encode(text) + ([tokenizer.eos_id] if tokenizer.eos_id >= 0 else [])
                out.write(np.asarray(ids, dtype=dtype).tobytes())
                offsets.append(offsets[-1] + len(ids))
        header = ShardHeader(token_bytes=width, vocab_size=tokenizer.vocab_size, eos_id=tokenizer.eos_id,
                             tokenizer=tokenizer.name, documents=len(offsets) - 1, tokens=offsets[-1])
        tmp_idx.write_bytes(index_bytes(header, offsets))
        os.replace(tmp_bin, bin_path)  # .bin first: an .idx always describes a complete .bin
        os.replace(tmp_idx, idx_path)
    finally:
        for tmp in (tmp_bin, tmp_idx):
            tmp.unlink(missing_ok=True)
    return header


# ---------------------------------------------------------------- reading


class TokenShards:
    """A dataset opened for reading: its header, document offsets and memory-mapped token ids."""

    def __init__(self, prefix: str | Path):
        self.prefix = str(prefix)
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise DataError(f"{path}: no such file (--data takes the prefix of PREFIX.bin and PREFIX.idx)")
        raw = idx_path.read_bytes()
        self.header, self.offsets = _parse_index(raw, idx_path)
        dtype = np.dtype("<u2" if self.header.token_bytes == 2 else "<u4")
        size = bin_path.stat().st_size
        if size != self.header.tokens * dtype.itemsize:
            raise DataError(f"{bin_path}: tokens: the index says {self.header.tokens} tokens "
                            f"({self.header.tokens * dtype.itemsize} bytes), the file has {size} bytes")
        # np.memmap refuses empty files; an empty dataset has no sample anyway
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)

    def document(self, i: int) -> np.ndarray:
        """The token ids of document i (with its end-of-document id)."""
        return np.asarray(self.tokens[self.offsets[i]:self.offsets[i + 1]])


def _parse_index(raw: bytes, path: Path) -> tuple[ShardHeader, np.ndarray]:
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise DataError(f"{path}: magic: not a planner token index (written by `python -m planner.runtime.data`)")
    magic, version, width, vocab, eos, docs, tokens, name_len = _HEADER.unpack_from(raw)
    if version != VERSION:
        raise DataError(f"{path}: version: {version}, this reader reads version {VERSION}")
    if width not in (2, 4):
        raise DataError(f"{path}: token_bytes: {width}, must be 2 or 4")
    start = _HEADER.size + name_len
    start += -start % 8
    if len(raw) != start + 8 * (docs + 1):
        raise DataError(f"{path}: documents: {docs} documents need {start + 8 * (docs + 1)} bytes, "
                        f"the file has {len(raw)}")
    name = raw[_HEADER.size:_HEADER.size + name_len].decode("utf-8")
    header = ShardHeader(token_bytes=width, vocab_size=vocab, eos_id=eos, tokenizer=name, documents=docs,
                         tokens=tokens)
    offsets = np.frombuffer(raw, dtype="<u8", offset=start, count=docs + 1)
    if offsets[0] != 0 or offsets[-1] != tokens or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise DataError(f"{path}: offsets: not a rising sequence from 0 to the token count {tokens}")
    return header, offsets


def _epoch_permutation(n: int, seed: int, epoch: int) -> tuple[int, int]:
    """(a, b) of the epoch's order i -> (a * i + b) mod n; a is coprime to n, so every sample comes once."""
    digest = hashlib.blake2b(f"planner-data:{seed}:{epoch}".encode(), digest_size=16).digest()
    a, b = int.from_bytes(digest[:8], "little") % n, int.from_bytes(digest[8:], "little") % n
    a = max(a, 1)
    while math.gcd(a, n) != 1:
        a += 1
    return a, b


class SampleReader:
    """This data-parallel rank's slice of every global batch of a TokenShards, from a resumable position.

    `position` counts the samples the whole job has consumed (the same on every rank); each `next_batch`
    takes the global batch at `position` and returns this rank's rows of it, then advances by the global
    batch.  Save `state_dict()` with a checkpoint and `load_state_dict` it to continue where it stopped.
    """

    def __init__(self, shards: TokenShards, *, seq_len: int, global_batch: int, dp_rank: int, dp_size: int,
                 seed: int = 0):
        if global_batch % dp_size:
            raise ValueError(f"global batch {global_batch} is not a multiple of the data-parallel size {dp_size}")
        self.shards, self.seq_len, self.seed = shards, seq_len, seed
        self.global_batch, self.per_rank = global_batch, global_batch // dp_size
        self.first_row = dp_rank * self.per_rank
        self.samples = (shards.header.tokens - 1) // seq_len if shards.header.tokens else 0
        if self.samples < 1:
            raise DataError(f"{shards.prefix}.idx: tokens: {shards.header.tokens} tokens hold no sample of "
                            f"seq_len + 1 = {seq_len + 1} tokens")
        self.position = 0

    def sample_index(self, position: int) -> int:
        """Which sample the job reads at global `position`."""
        epoch, i = divmod(position, self.samples)
        a, b = _epoch_permutation(self.samples, self.seed, epoch)
        return (a * i + b) % self.samples

    def sample(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return np.asarray(self.shards.tokens[start:start + self.seq_len + 1], dtype=np.int64)

    def next_batch(self):
        """(tokens, labels) of this rank's rows, (global_batch / dp, seq_len) int64 each; advances.  DataError
        when a token id of the global batch is not below the vocabulary size: every rank reads the whole
        batch's ids, so all stop at the same step, before an embedding meets the id."""
        import torch

        self.check_ids(self.position)
        first = self.position + self.first_row
        rows = np.stack([self.sample(self.sample_index(first + r)) for r in range(self.per_rank)])
        self.position += self.global_batch
        seq = torch.from_numpy(rows)
        return seq[:, :-1], seq[:, 1:]

    def check_ids(self, position: int) -> None:
        """DataError naming the file and the token when a sample of the global batch at `position` holds an id
        the tokenizer does not have (a damaged or foreign PREFIX.bin)."""
        vocab = self.shards.header.vocab_size
        for r in range(self.global_batch):
            index = self.sample_index(position + r)
            sample = self.sample(index)
            if sample.size and int(sample.max()) >= vocab:
                offset = index * self.seq_len + int(np.argmax(sample >= vocab))
                raise DataError(f"{self.shards.prefix}.bin: token {offset}: id {int(sample.max())} is not below "
                                f"the vocabulary size {vocab} of {self.shards.prefix}.idx (a damaged or foreign "
                                "file)")

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


# ---------------------------------------------------------------- command line


def _prefix(value: str) -> Path:
    """--output: a path whose last part names the files (PREFIX.bin), not a folder or nothing."""
    path = Path(value)
    if not value.strip() or value.endswith("/") or path.name in ("", ".", "..") or path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r}: name the files, e.g. data/train for data/train.bin and "
                                         "data/train.idx")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m planner.runtime.data",
                                     description="Write pre-tokenized token shards (PREFIX.bin + PREFIX.idx).")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="Tokenize text files into PREFIX.bin and PREFIX.idx.",
                           description="Tokenize text files into PREFIX.bin and PREFIX.idx (docs/data-format.md). "
                           "Example: python -m planner.runtime.data write --tokenizer bytes --input a.txt "
                           "b.jsonl --output data/train")
    write.add_argument("--tokenizer", required=True, metavar="NAME_OR_PATH",
                       help="`bytes` (built in), a tokenizer.json file, or a transformers name or folder.")
    write.add_argument("--input", required=True, nargs="+", type=Path, metavar="TEXT",
                       help="Text files: a .jsonl file holds one document per line, any other file is one.")
    write.add_argument("--output", required=True, type=_prefix, metavar="PREFIX",
                       help="Writes PREFIX.bin and PREFIX.idx.")
    write.add_argument("--json-key", default="text", help="Field of each .jsonl line holding the text (default text).")
    prof = sub.add_parser("profile", help="Write a data profile (planner compile --data-profile) of real data.",
                          description="Count the document lengths of token shards (--data) or of a Hugging Face "
                          "dataset sample (--hf-dataset) into a data profile YAML. Example: python -m "
                          "planner.runtime.data profile --data data/train --output profile.yaml")
    source = prof.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="PREFIX", help="Token shards PREFIX.bin + PREFIX.idx.")
    source.add_argument("--hf-dataset", metavar="NAME", help="A Hugging Face dataset (needs `datasets`).")
    prof.add_argument("--hf-data-files", default=None, metavar="FILES", help="data_files of --hf-dataset "
                      "(e.g. --hf-dataset json --hf-data-files rows.jsonl).")
    prof.add_argument("--split", default="train", help="Split of --hf-dataset (default train).")
    prof.add_argument("--samples", type=int, default=10000, help="Rows of --hf-dataset to count (default 10000).")
    prof.add_argument("--json-key", default="text", help="Field of each row holding the text (default text).")
    prof.add_argument("--tokenizer", default=BYTES_TOKENIZER, help="Tokenizer of --hf-dataset (default bytes).")
    prof.add_argument("--name", default=None, help="The profile's name (default: the output file's stem).")
    prof.add_argument("--output", required=True, type=Path, metavar="FILE", help="The profile YAML to write.")
    return parser.parse_args(argv)


def _profile(args: argparse.Namespace) -> int:
    """`profile`: every document's tokens (its end-of-document id included, as the trainer's sampler reads
    them), from the shards or a dataset sample, into a data profile."""
    from planner.runtime.data_profile import hf_texts, write_profile

    try:
        if args.data is not None:
            shards = TokenShards(args.data)
            lengths = [int(n) for n in np.diff(shards.offsets.astype(np.int64))]
            source = (f"token shards {args.data} ({shards.header.documents} documents, {shards.header.tokens} "
                      f"tokens, tokenizer {shards.header.tokenizer})")
        else:
            texts = hf_texts(args.hf_dataset, split=args.split, samples=args.samples, key=args.json_key,
                             data_files=args.hf_data_files)
            tok = load_tokenizer(args.tokenizer)
            lengths = [len(tok.encode(t)) for t in texts]
            source = f"Hugging Face dataset {args.hf_dataset} ({len(texts)} rows of {args.split}, tokenizer " \
                     f"{args.tokenizer})"
        doc = write_profile(args.output, args.name or args.output.stem, lengths, source)
    except ValueError as err:
        raise DataError(str(err)) from None
    print(f"{args.output}: {sum(b['count'] for b in doc['bins'])} documents in {len(doc['bins'])} bins ({source})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "profile":
            return _profile(args)
        tokenizer = load_tokenizer(args.tokenizer)
        header = write_dataset(documents(args.input, args.json_key), tokenizer, args.output)
    except DataError as err:
        sys.stderr.write(f"python -m planner.runtime.data: error: {err}\n")
        return 2
    print(f"{args.output}.bin: {header.tokens} tokens in {header.documents} documents "
          f"(uint{8 * header.token_bytes}, vocab {header.vocab_size}, tokenizer {header.tokenizer})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
