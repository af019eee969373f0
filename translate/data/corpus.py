"""Parallel text to padded subword batches, and the LightningDataModule that wires it up. Pipeline: `read_split` ->
`train_vocab` on the training split (or a checkpoint's vocabularies) -> `encode_split` -> `TokenBatchSampler` ->
`collate`. With `subword_sampling`, `SampledSegmentations` draws a new segmentation of each training pair per batch
(subword regularisation).

Legend: B batch, S source length, T target length (the target plus one bos/eos shift)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import lightning as L
import numpy as np
import sentencepiece as spm
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from core.runtime.checkpoint import load_checkpoint
from core.runtime.errors import InputError, check_text
from core.runtime.resume import EpochBatchSampler
from translate.data.vocab import BOS_ID, EOS_ID, PAD_ID, ModelType, SubwordVocab, train_vocab, vocabs_from_checkpoint

logger = logging.getLogger(__name__)

Split = Literal["train", "val", "test"]
# A split's files: a prefix ("data/translate_demo/train" -> train.en, train.de), a pattern with "{lang}"
# ("corpus/{lang}/train.txt"), an explicit (src_path, tgt_path) pair, or one ".tsv" file of "source<TAB>target" lines.
SplitPaths = str | tuple[str, str]
# The resolved files: (source, target), or (tsv,) for a TSV file holding both sides.
SplitFiles = tuple[Path, Path] | tuple[Path]
TSV_SUFFIX = ".tsv"
WRITTEN_BY = "python -m translate fit"


def resolve_paths(paths: SplitPaths, src_lang: str, tgt_lang: str) -> SplitFiles:
    """The files of one split (`SplitPaths`); `src_lang` and `tgt_lang` are the suffixes ("en")."""
    if not isinstance(paths, str):
        if len(paths) != 2:
            raise InputError(f"explicit split paths must be a (src_path, tgt_path) pair, got {paths!r}")
        return Path(paths[0]), Path(paths[1])
    if paths.lower().endswith(TSV_SUFFIX):
        return (Path(paths),)
    if "{lang}" in paths:
        return Path(paths.replace("{lang}", src_lang)), Path(paths.replace("{lang}", tgt_lang))
    return Path(f"{paths}.{src_lang}"), Path(f"{paths}.{tgt_lang}")


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (a byte-order mark and CRLF endings accepted), without line endings. Splits on
    "\\n" only: `str.splitlines` also splits on U+2028 and friends, shifting each later line against its translation."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the split path and the language suffix")
    data = path.read_bytes()
    check_text(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x} at column {column}); "
                         "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`") from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.removesuffix("\r") for line in lines]


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Two line-aligned files; an error names the file and line where they stop aligning."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not lines:
            raise InputError(f"{path}:1: empty file; a split needs one sentence per line")
    if len(src) != len(tgt):
        (short, n_short), (long, n_long) = sorted([(src_path, len(src)), (tgt_path, len(tgt))], key=lambda p: p[1])
        raise InputError(f"{short}:{n_short + 1}: line missing: {short} has {n_short} lines but {long} has {n_long}; "
                         "parallel files must hold one sentence per line, aligned")
    return src, tgt


def read_tsv(path: str | Path) -> tuple[list[str], list[str]]:
    """A bitext file of `source<TAB>target` lines, read as `read_lines` reads them."""
    lines = read_lines(path)
    if not lines:
        raise InputError(f"{path}:1: empty file; a TSV split needs one `source<TAB>target` pair per line")
    for number, line in enumerate(lines, 1):
        if (tabs := line.count("\t")) != 1:
            raise InputError(f"{path}:{number}: {tabs} tabs; a TSV split needs exactly one tab per line "
                             "(`source<TAB>target`): remove the extra tabs or pass two aligned files")
    src, tgt = zip(*(line.split("\t") for line in lines), strict=True)
    return list(src), list(tgt)


def read_split(files: SplitFiles) -> tuple[list[str], list[str]]:
    """The (sources, targets) of a split's files (`resolve_paths`): a TSV file or two line-aligned files."""
    return read_tsv(files[0]) if len(files) == 1 else read_parallel(*files)


def drop_blank_pairs(src: Sequence[str], tgt: Sequence[str], name: str = "train") -> tuple[list[str], list[str]]:
    """Keep the pairs where both sides have text; log how many were skipped (`name`: the files, for the log)."""
    keep = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s.strip() and t.strip()]
    if len(keep) < len(src):
        logger.info("%s: skipped %d of %d pairs with a blank side", name, len(src) - len(keep), len(src))
    if not keep:
        raise InputError(f"{name}: all {len(src)} pairs (lines 1-{len(src)}) have a blank side; nothing to train on")
    return [src[i] for i in keep], [tgt[i] for i in keep]


class Example(NamedTuple):
    """One encoded pair: its dataset index and subword ids (no bos/eos)."""

    index: int
    src: list[int]
    tgt: list[int]


@dataclass
class Batch:
    """A padded batch (pad = 0). Tensors only, so Lightning moves it and infers B without help. `index` points into the
    dataset, whose `sources`/`refs` hold the raw strings (sacreBLEU scores against `refs`, never decoded ids)."""

    src: Tensor  # (B, S)
    tgt_in: Tensor  # (B, T) bos + target
    tgt_out: Tensor  # (B, T) target + eos
    index: Tensor  # (B,)


def collate(examples: Sequence[Example]) -> Batch:
    """Pad examples into a `Batch`: src with 0; tgt_in = [bos] + tgt, tgt_out = tgt + [eos], padded with 0."""
    s = max(1, max(len(e.src) for e in examples))  # width >= 1: an all-blank batch still has a (fully masked) column
    t = max(len(e.tgt) for e in examples) + 1
    # Python lists, then one tensor per field: much faster than filling the tensors row by row.
    src = [e.src + [PAD_ID] * (s - len(e.src)) for e in examples]
    tgt_in = [[BOS_ID, *e.tgt] + [PAD_ID] * (t - 1 - len(e.tgt)) for e in examples]
    tgt_out = [[*e.tgt, EOS_ID] + [PAD_ID] * (t - 1 - len(e.tgt)) for e in examples]
    return Batch(*(torch.tensor(x, dtype=torch.long) for x in (src, tgt_in, tgt_out, [e.index for e in examples])))


class TranslationDataset(Dataset[Example]):
    """Encoded sentence pairs (ids without bos/eos) plus their raw text; `refs` are sacreBLEU's references."""

    def __init__(self, src_ids: list[list[int]], tgt_ids: list[list[int]], sources: list[str], refs: list[str]):
        if not len(src_ids) == len(tgt_ids) == len(sources) == len(refs):
            raise InputError("src_ids, tgt_ids, sources and refs must have one entry per pair")
        self.src_ids, self.tgt_ids, self.sources, self.refs = src_ids, tgt_ids, sources, refs

    def __len__(self) -> int:
        return len(self.src_ids)

    def __getitem__(self, index: int) -> Example:
        return Example(index, self.src_ids[index], self.tgt_ids[index])

    @property
    def widths(self) -> list[int]:  # the padded width each pair needs in a batch
        return [max(len(s), len(t) + 1) for s, t in zip(self.src_ids, self.tgt_ids, strict=True)]


class SampledSegmentations(Dataset[Example]):
    """A training split that draws a new subword segmentation of each pair every time it is fetched. Subword
    regularisation (`SubwordVocab.sample_batch`) helps small corpora. Batches are still planned on the deterministic
    segmentation (`widths`), so an epoch has the same number of batches every time (Lightning's step counts, LR
    schedules and DDP ranks rely on it); sampled segmentations are longer, so a batch holds more than `max_tokens`. A
    pair whose sample exceeds `max_len` keeps its deterministic ids. The draws are seeded by (seed, rank, DataLoader
    worker) (`reseed`); sentencepiece's draws repeat within a process only, so a resumed run does not replay them."""

    def __init__(self, base: TranslationDataset, src_vocab: SubwordVocab, tgt_vocab: SubwordVocab, alpha: float,
                 max_len: int, seed: int = 0, rank: int = 0):
        self.base, self.src_vocab, self.tgt_vocab = base, src_vocab, tgt_vocab
        self.alpha, self.max_len, self.seed, self.rank = alpha, max_len, seed, rank
        self.sources, self.refs = base.sources, base.refs

    def __len__(self) -> int:
        return len(self.base)

    @property
    def widths(self) -> list[int]:
        return self.base.widths

    def reseed(self, worker_id: int = -1) -> None:
        """Restart sentencepiece's generator from (seed, rank, worker); a DataLoader `worker_init_fn`. The generator is
        process-wide, and forked workers would otherwise all continue the parent's stream: the same segmentations."""
        state = np.random.SeedSequence([self.seed, self.rank, worker_id + 1]).generate_state(1)[0]
        spm.set_random_generator_seed(int(state))

    def __getitems__(self, indices: Sequence[int]) -> list[Example]:
        # The DataLoader's batched fetch (torch calls it with the batch's indices when it exists).
        src = self.src_vocab.sample_batch([self.sources[i] for i in indices], self.alpha)
        tgt = self.tgt_vocab.sample_batch([self.refs[i] for i in indices], self.alpha)
        examples = []
        for i, s, t in zip(indices, src, tgt, strict=True):
            if len(s) > self.max_len or len(t) + 1 > self.max_len:
                s, t = self.base.src_ids[i], self.base.tgt_ids[i]
            examples.append(Example(i, s, t))
        return examples

    def __getitem__(self, index: int) -> Example:
        return self.__getitems__([index])[0]


def encode_split(sources: Sequence[str], refs: Sequence[str], src_vocab: SubwordVocab, tgt_vocab: SubwordVocab,
                 max_len: int, max_ratio: float | None = None, train: bool = True, name: str = "train",
                 ) -> TranslationDataset:
    """Encode a split. Training drops long pairs and bad length ratios; evaluation truncates. Every tensor built from
    the result has at most `max_len` positions: the source at most `max_len` subwords, the target at most `max_len - 1`
    (bos/eos take the last position). Evaluation keeps every pair so references stay complete. `max_ratio` (training
    only): drop pairs whose longer side has more than `max_ratio` times the subwords of the shorter; None keeps all."""
    src_ids, tgt_ids = src_vocab.encode_batch(sources), tgt_vocab.encode_batch(refs)
    if not train:
        cut = sum(len(s) > max_len or len(t) > max_len - 1 for s, t in zip(src_ids, tgt_ids, strict=True))
        if cut:
            logger.warning("%s: truncated %d of %d pairs to max_len=%d subwords", name, cut, len(src_ids), max_len)
        return TranslationDataset([s[:max_len] for s in src_ids], [t[: max_len - 1] for t in tgt_ids], list(sources),
                                  list(refs))
    too_long = ratio = 0
    keep = []
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if len(s) > max_len or len(t) + 1 > max_len:
            too_long += 1
        elif max_ratio is not None and max(len(s), len(t)) > max_ratio * max(1, min(len(s), len(t))):
            ratio += 1
        else:
            keep.append(i)
    logger.info("%s: kept %d of %d pairs; dropped %d longer than max_len=%d subwords, %d with length ratio > %s",
                name, len(keep), len(src_ids), too_long, max_len, ratio, max_ratio)
    if not keep:
        raise InputError(f"{name}: every pair was filtered out; raise `max_len` ({max_len}) or `max_ratio` "
                         f"({max_ratio})")
    return TranslationDataset(*([seq[i] for i in keep] for seq in (src_ids, tgt_ids, sources, refs)))


def batch_sizes(sorted_widths: Sequence[int], max_tokens: int) -> list[int]:
    """Greedy split of ascending widths into batches with count x max width <= max_tokens."""
    sizes, count = [], 0
    for width in sorted_widths:  # ascending, so the newest item is the widest
        if count and (count + 1) * width > max_tokens:
            sizes.append(count)
            count = 0
        count += 1
    if count:
        sizes.append(count)
    return sizes


class TokenBatchSampler(EpochBatchSampler):
    """Length-bucketed batches of at most `max_tokens` padded tokens (count x widest example). With `shuffle`, equal
    widths are put in random order and the batch order is shuffled, both seeded by (seed, epoch). Only ties are shuffled
    (no length noise): the batch sizes and `len(self)` stay the same every epoch, which Lightning's step counts, LR
    schedules and DDP ranks (that must run equally many steps) rely on. Under DDP every rank builds the same batch list
    and takes every `world_size`-th batch, the list padded by repeating its first; Lightning must keep this sampler."""

    def __init__(self, widths: Sequence[int], max_tokens: int, shuffle: bool = False, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        self.widths = np.asarray(widths, dtype=np.int64)
        if not 0 <= rank < world_size:
            raise InputError(f"`rank` ({rank}) must be in [0, world_size) with `world_size` ({world_size}) >= 1")
        if len(self.widths) and self.widths.max() > max_tokens:
            i = int(self.widths.argmax())
            raise InputError(f"example {i} is {self.widths[i]} tokens wide but `max_tokens` is {max_tokens}; "
                             "raise `max_tokens` or lower `max_len`")
        super().__init__(seed)
        self.max_tokens, self.shuffle = max_tokens, shuffle
        self.rank, self.world_size = rank, world_size
        self.sizes = batch_sizes(np.sort(self.widths).tolist(), max_tokens)

    def __len__(self) -> int:
        return math.ceil(len(self.sizes) / self.world_size)

    def epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        if self.shuffle:
            perm = rng.permutation(len(self.widths))
            order = perm[np.argsort(self.widths[perm], kind="stable")]  # random among equal widths
        else:
            order = np.argsort(self.widths, kind="stable")
        batches = np.split(order, np.cumsum(self.sizes)[:-1]) if self.sizes else []
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        missing = len(self) * self.world_size - len(batches)
        batches += [batches[i % len(batches)] for i in range(missing)]
        return batches[self.rank :: self.world_size]


class TranslationDataModule(L.LightningDataModule):
    """Parallel text files -> subword batches; the vocabularies exist right after construction. Construction trains (or
    loads from cache) the sentencepiece model(s), so `src_vocab_size`, `tgt_vocab_size` and `pad_id` can be linked into
    the model when it is instantiated.

    Args:
        train: training files: a prefix (`data/train` -> `train.en`, `train.de`), a pattern with `{lang}`, a
            (src_path, tgt_path) pair or a `.tsv` file of `source<TAB>target` lines; `fit` needs it.
        val: validation files, same forms as `train`; `fit` and `validate` need them.
        test: test files, same forms as `train`, or None (no test split).
        src_lang: source language suffix, e.g. "en".
        tgt_lang: target language suffix, e.g. "de".
        vocab_size: sentencepiece pieces per vocabulary, specials included (an upper bound on small corpora).
        model_type: sentencepiece algorithm, "bpe" or "unigram".
        joint_vocab: one vocabulary trained on both sides (True) or one per language.
        max_tokens: padded tokens per batch (batch size x longest sequence).
        max_len: longest sequence in subwords (target counted with its bos/eos); longer training pairs are
            dropped, longer evaluation pairs truncated.
        max_ratio: drop training pairs whose longer side has more than this many times the shorter's subwords.
        character_coverage: sentencepiece character coverage (1.0 keeps every character seen).
        cache_dir: where trained sentencepiece models are cached by content hash (None: no cache).
        subword_sampling: draw a new segmentation of each training pair per batch, 0: off. BPE: the probability
            of dropping each merge (BPE-dropout, 0.1 is usual); unigram: the sampling alpha (0.1-0.2 is usual).
        seed: seed of the training batch shuffle and of the segmentation draws.
        num_workers: DataLoader worker processes (0 loads in the main process).
        predict: source sentences for `predict` to translate, one per line; None translates `test`'s sources.
        vocab: a checkpoint written by `python -m translate fit` whose vocabularies to use instead of training
            them on `train`; `test`, `validate` and `predict --ckpt_path CKPT` read CKPT's without `train`."""

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, train: SplitPaths | None = None, val: SplitPaths | None = None, test: SplitPaths | None = None,
                 src_lang: str = "en", tgt_lang: str = "de", vocab_size: int = 8000, model_type: ModelType = "bpe",
                 joint_vocab: bool = True, max_tokens: int = 4096, max_len: int = 128, max_ratio: float = 3.0,
                 character_coverage: float = 1.0, cache_dir: str | None = ".cache/spm", subword_sampling: float = 0.0,
                 seed: int = 0, num_workers: int = 0, predict: str | None = None, vocab: str | None = None):
        super().__init__()
        self.save_hyperparameters()
        if max_len < 2:
            raise InputError(f"`max_len` ({max_len}) must be >= 2: a target needs its token and the bos/eos position")
        if max_tokens < max_len:
            raise InputError(f"`max_tokens` ({max_tokens}) must be >= `max_len` ({max_len}) so the longest pair fits")
        if subword_sampling < 0 or (model_type == "bpe" and subword_sampling > 1):
            bpe = " and <= 1: with BPE it is a probability (0.1 is usual)" if model_type == "bpe" else ""
            raise InputError(f"`data.subword_sampling` ({subword_sampling}) must be >= 0 (0 turns it off){bpe}")
        if max_ratio < 1.0:
            raise InputError(f"`max_ratio` ({max_ratio}) must be >= 1 (it bounds longer / shorter side)")
        self.paths: dict[str, SplitFiles | None] = {
            split: None if paths is None else resolve_paths(paths, src_lang, tgt_lang)
            for split, paths in (("train", train), ("val", val), ("test", test))
        }
        self._train_text: tuple[list[str], list[str]] | None = None
        if vocab is not None:
            state = load_checkpoint(vocab, WRITTEN_BY)
            self.src_vocab, self.tgt_vocab = vocabs_from_checkpoint(state, f"data.vocab {vocab}")
        elif train is None:
            raise InputError("data.train: no training files; `fit` needs them (a prefix, a {lang} pattern, a pair "
                             "or a .tsv file), and `test`/`validate` without them need --ckpt_path CKPT or "
                             "--data.vocab CKPT for the vocabularies")
        else:
            src, tgt = self._read_train()
            options = {"vocab_size": vocab_size, "model_type": model_type,
                       "character_coverage": character_coverage, "cache_dir": cache_dir}
            self.src_vocab = train_vocab(src + tgt if joint_vocab else src, **options)
            self.tgt_vocab = self.src_vocab if joint_vocab else train_vocab(tgt, **options)
        self._datasets: dict[str, TranslationDataset] = {}

    def _read_train(self) -> tuple[list[str], list[str]]:
        if self._train_text is None:
            files = self.paths["train"]
            self._train_text = drop_blank_pairs(*read_split(files), name=" / ".join(map(str, files)))
        return self._train_text

    @property
    def src_vocab_size(self) -> int:
        return self.src_vocab.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt_vocab.vocab_size

    def dataset(self, split: Split) -> TranslationDataset:
        """The encoded split (built on first use); its `refs` are the raw references."""
        if split not in self._datasets:
            if (paths := self.paths.get(split)) is None:
                raise InputError(f"data.{split}: no `{split}` files configured; pass --data.{split} (a prefix, a "
                                 "{lang} pattern, a pair or a .tsv file)")
            sources, refs = self._read_train() if split == "train" else read_split(paths)
            self._datasets[split] = encode_split(sources, refs, self.src_vocab, self.tgt_vocab, self.hparams.max_len,
                                                 self.hparams.max_ratio, split == "train", split)
        return self._datasets[split]

    def predict_dataset(self) -> TranslationDataset:
        """The sentences `predict` translates, encoded (built on first use; no references, and none filtered)."""
        if "predict" not in self._datasets:
            if (predict := self.hparams.predict) is None and self.paths["test"] is None:
                raise InputError("`predict` has nothing to translate: set `data.predict` to a file of source "
                                 "sentences, one per line")
            sources = read_lines(predict) if predict else read_split(self.paths["test"])[0]
            self._datasets["predict"] = encode_split(sources, [""] * len(sources), self.src_vocab, self.tgt_vocab,
                                                     self.hparams.max_len, train=False, name="predict")
        return self._datasets["predict"]

    def setup(self, stage: str) -> None:
        for split in {"fit": ["train", "val"], "validate": ["val"], "test": ["test"]}.get(stage, []):
            self.dataset(split)

    def _loader(self, split: Split | Literal["predict"]) -> DataLoader:
        ds: TranslationDataset | SampledSegmentations
        ds = self.predict_dataset() if split == "predict" else self.dataset(split)
        hp, trainer = self.hparams, self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = TokenBatchSampler(ds.widths, hp.max_tokens, split == "train", hp.seed, rank, world_size)
        init_worker = None
        if split == "train" and hp.subword_sampling > 0:
            ds = SampledSegmentations(ds, self.src_vocab, self.tgt_vocab, hp.subword_sampling, hp.max_len,
                                      seed=hp.seed, rank=rank)
            ds.reseed()
            init_worker = ds.reseed
        # A generator of the loader's own: fetching data draws nothing from the global one (core.runtime.resume).
        return DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=hp.num_workers,
                          persistent_workers=hp.num_workers > 0, worker_init_fn=init_worker,
                          generator=torch.Generator().manual_seed(hp.seed))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")

    def state_dict(self) -> dict[str, Any]:
        """The vocabularies as model protos, so a checkpoint restores them with no files."""
        return {"src_vocab": self.src_vocab.to_bytes(), "tgt_vocab": self.tgt_vocab.to_bytes()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Adopt a checkpoint's vocabularies (the model was trained with them); re-encode if they differ."""
        src, tgt = SubwordVocab.from_bytes(state_dict["src_vocab"]), SubwordVocab.from_bytes(state_dict["tgt_vocab"])
        if src != self.src_vocab or tgt != self.tgt_vocab:
            logger.warning("checkpoint vocabularies differ from the ones trained on %s; using the checkpoint's",
                           self.paths["train"][0] if self.paths["train"] else "data.vocab")
            self.src_vocab, self.tgt_vocab = src, (src if tgt == src else tgt)
            self._datasets.clear()
