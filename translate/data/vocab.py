"""Subword vocabulary: a sentencepiece model with fixed special ids, trained once and cached.

The model code relies on pad=0, unk=1, bos=2, eos=3: `train_vocab` fixes them and `SubwordVocab` refuses a model that
disagrees. Training is cached by content (sha256 of the options, the sentencepiece version and every sentence). Training
is deterministic, which matters under DDP: every rank trains (or loads) on its own and must end up with the same pieces;
the write is atomic so ranks racing on a cold cache cannot read a half-written file."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm
from torch import Tensor

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError

# Where a checkpoint holds the vocabularies: Lightning stores `TranslationDataModule.state_dict()` (the
# sentencepiece protos as bytes) under the data module's class name.
VOCAB_KEY = "TranslationDataModule"

logger = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
WORD_BOUNDARY = "\u2581"  # '▁', sentencepiece's marker for "a whitespace preceded this piece"

ModelType = Literal["bpe", "unigram"]


def piece_word_index(pieces: Sequence[str]) -> list[int]:
    """The whitespace word of each piece: a piece starting with '▁' opens one (pieces before the first: word 0). The
    words are exactly `text.split()` of the encoded text, as the demo corpus' Pharaoh alignments count them:
    `["▁der", "▁Hund", "e", "▁."]` -> `[0, 1, 1, 2]`."""
    index, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_BOUNDARY) or word < 0:
            word += 1
        index.append(word)
    return index


class SubwordVocab:
    """A sentencepiece model (`model_proto`: the bytes of a `.model` file) with pad=0, unk=1, bos=2, eos=3."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        found = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise InputError(f"sentencepiece model has (pad, unk, bos, eos) ids {found}, expected (0, 1, 2, 3); train "
                             "it with `translate.data.vocab.train_vocab` (or pad_id=0 unk_id=1 bos_id=2 eos_id=3)")

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> SubwordVocab:
        return cls(model_proto)

    @classmethod
    def from_file(cls, path: str | Path) -> SubwordVocab:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {path}; train one with `train_vocab`")
        return cls(path.read_bytes())

    def to_bytes(self) -> bytes:
        return self._proto

    def save(self, path: str | Path) -> None:
        """Write the model as a `.model` file that `spm_encode` and `from_file` read."""
        Path(path).write_bytes(self._proto)

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (the embedding table size)."""
        return self._sp.get_piece_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordVocab) and other._proto == self._proto

    def __getstate__(self) -> bytes:
        # DataLoader workers and ddp_spawn pickle the vocabulary: ship the proto only.
        return self._proto

    def __setstate__(self, state: bytes) -> None:
        self.__init__(state)

    def encode(self, text: str) -> list[int]:
        """Without bos/eos."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of many sentences (sentencepiece encodes them in C++, multi-threaded)."""
        return self._sp.encode(list(texts))

    def sample_batch(self, texts: Sequence[str], alpha: float) -> list[list[int]]:
        """A random segmentation of each sentence (subword regularisation): BPE drops each merge with probability
        `alpha` (BPE-dropout; 1.0 gives characters), unigram samples the lattice with probabilities raised to `alpha`.
        Sentence by sentence in the calling thread: sentencepiece's generator is per thread, and a batch call runs on
        fresh pool threads, which after a reseed draw the same stream on every call."""
        return [self._sp.encode(text, enable_sampling=True, alpha=alpha, nbest_size=-1) for text in texts]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Text of ids as the model produces them (`[bos, 57, 9, eos, pad]`): stops at the first eos, drops pad/bos."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def tokenize(self, text: str) -> list[str]:
        """Surface pieces of one sentence, e.g. `["▁der", "▁Hund", "e"]`."""
        return self._sp.encode(text, out_type=str)

    def pieces(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Piece strings of ids (`<pad>`, `<s>`, `</s>`, `<unk>` for the specials)."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return [self._sp.id_to_piece(i) for i in ids]

    def word_index(self, ids: Sequence[int] | Tensor) -> list[int]:
        """Whitespace-word index of each id (`piece_word_index`), -1 for pad/bos/eos: subword to word alignments."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        real = [i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)]
        words = iter(piece_word_index(self.pieces(real)))
        return [-1 if i in (PAD_ID, BOS_ID, EOS_ID) else next(words) for i in ids]


def _options(vocab_size: int, model_type: ModelType, character_coverage: float) -> dict[str, object]:
    """sentencepiece trainer options; everything that shapes the model, so it all goes into the hash."""
    if vocab_size <= EOS_ID + 1:
        raise InputError(f"`vocab_size` ({vocab_size}) must exceed the 4 special ids (pad, unk, bos, eos)")
    if model_type not in ("bpe", "unigram"):
        raise InputError(f"`model_type` must be 'bpe' or 'unigram', got {model_type!r}")
    if not 0.0 < character_coverage <= 1.0:
        raise InputError(f"`character_coverage` must be in (0, 1], got {character_coverage}")
    return {
        "vocab_size": vocab_size, "model_type": model_type, "character_coverage": character_coverage,
        "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID,
        # A corpus too small for `vocab_size` (the demo: ~400 word types) gets as many
        # pieces as it supports instead of an error; the real size is logged.
        "hard_vocab_limit": False,
        "input_sentence_size": 0,  # use every sentence: sampling would make the hash lie
    }


def content_hash(sentences: Iterable[str], options: dict[str, object]) -> str:
    """sha256 (hex) of the trainer options, the sentencepiece version and the sentences."""
    h = hashlib.sha256()
    h.update(json.dumps({"options": options, "sentencepiece": spm.__version__}, sort_keys=True).encode())
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def train_vocab(sentences: Sequence[str], vocab_size: int, model_type: ModelType = "bpe",
                character_coverage: float = 1.0, cache_dir: str | Path | None = ".cache/spm") -> SubwordVocab:
    """Train a sentencepiece model on `sentences` (both sides for a joint vocabulary), or load it from the content-hash
    cache in `cache_dir` (None: train every time, write nothing); a small corpus gets fewer than `vocab_size` pieces."""
    options = _options(vocab_size, model_type, character_coverage)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{content_hash(sentences, options)}.model"
        if path.is_file():
            vocab = SubwordVocab.from_file(path)
            logger.info("loaded cached sentencepiece model %s (%d pieces)", path, vocab.vocab_size)
            return vocab
    if not any(s.strip() for s in sentences):
        raise InputError("cannot train a sentencepiece model on no text: every training sentence is blank")
    start = time.perf_counter()
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=proto, minloglevel=2, **options)
    vocab = SubwordVocab(proto.getvalue())
    logger.info("trained sentencepiece %s model: %d pieces (asked %d) on %d sentences in %.2f s",
                model_type, vocab.vocab_size, vocab_size, len(sentences), time.perf_counter() - start)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(vocab.to_bytes())
        logger.info("cached it as %s", path)
    return vocab


def not_a_checkpoint(where: object) -> InputError:
    return InputError(f"{where}: not a Translate checkpoint (no vocabularies); pass a checkpoint written by "
                      "`python -m translate fit`")


def vocabs_from_checkpoint(checkpoint: dict[str, Any], where: object = None,
                           ) -> tuple[SubwordVocab, SubwordVocab] | None:
    """The (source, target) vocabularies stored in a checkpoint dict; if it holds none, None, or with `where`
    (the file) `not_a_checkpoint`'s error."""
    state = checkpoint.get(VOCAB_KEY)
    if not isinstance(state, dict):  # a subclassed data module is stored under its own class name
        state = next((v for v in checkpoint.values() if isinstance(v, dict) and "src_vocab" in v
                      and "tgt_vocab" in v), None)
    if state is None or not isinstance(state.get("src_vocab"), bytes | bytearray):
        if where is not None:
            raise not_a_checkpoint(where)
        return None
    src = SubwordVocab.from_bytes(state["src_vocab"])
    tgt = src if state["tgt_vocab"] == state["src_vocab"] else SubwordVocab.from_bytes(state["tgt_vocab"])
    return src, tgt
