"""Translate a text file (or stdin) with a checkpoint written by `python -m translate fit`.

Exactly one output line per input line, in input order; a blank input line gives an empty output line, and `--n-best N`
puts the N best translations on one line, tab-separated. The input is read, sorted by length and translated a chunk of
`--chunk-lines` at a time, so memory does not grow with the input and the output equals that of one chunk holding the
whole file. Sources longer than the model's `max_len` subwords are truncated, with a warning naming the line. `-o`,
`--alignments` and `--html` appear in one rename at the end, never half-written; one run at a time writes an `-o` file
(`OUTPUT.lock`). A run from `-i FILE` to `-o FILE` keeps its lines in a hidden partial file as they are written, so the
same command after a kill or a stop continues where it was. Several checkpoints translate as an ensemble (the mean of
their probabilities; alignments come from the first). Scaling out: `--engine ray` (translate.ray_engine), `--shard` and
`python -m translate.shards merge` (translate.shards). See docs/translate.md."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import IO

import torch

from core.nn.explain import attention_layers
from core.runtime.atomic import atomic_path, stale_temporaries
from core.runtime.errors import InputError, check_text, describe_os_error, skip_exit_collection
from core.runtime.lock import OutputLock, interrupt_on_sigterm
from core.runtime.ray_session import RayCluster, add_ray_arguments
from core.runtime.shards import Shard, parse_shard
from translate.alignment_page import write_html
from translate.api import CHUNK_LINES, DTYPES, INT8, MAX_TRUNCATION_WARNINGS, Translator
from translate.ray_engine import translate_on_ray
from translate.search.align import DEFAULT_LAYER, Layer, WordAlignment
from translate.search.options import SearchOptions
from translate.shards import shard_runs, write_record

log = logging.getLogger("translate.infer")
MAX_LINE_BYTES = 1 << 20  # one sentence per line; a longer "line" is a file with no line breaks
CHUNK_BYTES = 16 << 20  # a chunk of very long lines ends early: its text, not its line count, bounds memory


def read_chunks(stream: IO[bytes], size: int, name: str = "<stdin>", max_bytes: int = CHUNK_BYTES,
                ) -> Iterator[list[str]]:
    """Lines of a UTF-8 byte stream, `size` at a time, split on "\\n" only (as `translate.data.corpus.read_lines`). A
    chunk ends early once its lines hold `max_bytes` bytes (it holds at least one line). A byte-order mark and CRLF
    endings are accepted; invalid UTF-8, a NUL byte or a line over `MAX_LINE_BYTES` raises `InputError` naming it."""
    chunk: list[str] = []
    held = 0  # bytes in `chunk`
    for number, raw in enumerate(stream, start=1):
        check_text(raw, name, number)
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(f"{name}:{number}: a line of {len(raw):,} bytes (the limit is {MAX_LINE_BYTES:,}); "
                             "put one sentence per line")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{name}:{number}: invalid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                             f"{err.start + 1}); re-encode the input as UTF-8") from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        chunk.append(line.removesuffix("\n").removesuffix("\r"))
        held += len(raw)
        if len(chunk) == size or held >= max_bytes:
            yield chunk
            chunk, held = [], 0
    if chunk:
        yield chunk


class AtomicOutputs(contextlib.ExitStack):
    """Output files written under temporary names and renamed into place only if the whole block succeeds."""

    def reserve(self, path: str | Path) -> Path:
        """A temporary path beside `path` that is renamed to `path` when the block exits without error."""
        tmp = self.enter_context(atomic_path(path))
        tmp.touch()
        return tmp

    def open(self, path: str | Path) -> IO[bytes]:
        """A binary file that becomes `path` when the block exits without error."""
        return self.enter_context(open(self.reserve(path), "wb"))  # closed before its rename (LIFO)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a prefix such as `--beam` is refused, not read as `--beam-size`
    p = argparse.ArgumentParser(prog="python -m translate.infer", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, nargs="+", metavar="CKPT",
                   help="checkpoint written by `python -m translate fit` (or .average); several translate as "
                        "an ensemble (the mean of their probabilities; alignments come from the first)")
    p.add_argument("-i", "--input", help="input text, one sentence per line (default or -: stdin)")
    p.add_argument("-o", "--output", help="output file, written atomically (default: stdout)")
    p.add_argument("--beam-size", type=int, default=5, help="beam width; 1 = greedy search (default 5)")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length-penalty exponent (default 0.6)")
    p.add_argument("--max-len-a", type=float, default=1.5,
                   help="output length limit: A x source subwords + B (default A 1.5; fairseq's --max-len-a)")
    p.add_argument("--max-len-b", type=int, default=10, help="the B of that limit (default 10)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per search batch (default 64)")
    p.add_argument("--n-best", type=int, default=1, help="translations per line, tab-separated (default 1)")
    p.add_argument("--alignments", help="write word alignments of the best translation as JSON lines here")
    p.add_argument("--align-layer", default=str(DEFAULT_LAYER),
                   help=f"decoder layer for alignments: index (negative from the last) or 'mean' "
                        f"(default {DEFAULT_LAYER})")
    p.add_argument("--html", help="write a self-contained HTML page of alignment heatmaps here")
    p.add_argument("--html-max", type=int, default=100, help="sentences shown in --html (default 100)")
    p.add_argument("--chunk-lines", "--chunk-size", dest="chunk_lines", type=int, default=CHUNK_LINES,
                   help=f"lines read, sorted by length and translated together before the next are read (default "
                        f"{CHUNK_LINES:,}; a chunk also ends after {CHUNK_BYTES >> 20} MiB of text): memory grows "
                        "with the chunk, not the input")
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N or auto (cuda when available; cpu with --dtype int8 or --engine ray)")
    p.add_argument("--dtype", choices=(*DTYPES, INT8), default="float32",
                   help="weights and activations: float32 (default), bfloat16 (float32, with a warning, on a "
                        "CPU without fast bf16) or int8 (int8 linear layers, CPU only); docs/results.md compares "
                        "their speed and BLEU")
    p.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    p.add_argument("--fresh", action="store_true",
                   help="start over instead of continuing the lines an interrupted run with -i and -o kept")
    p.add_argument("--shard", help="I/N: translate only shard I of N (blocks of --chunk-lines lines, block b in "
                                   "shard b mod N); merge the parts with python -m translate.shards merge")
    add_ray_arguments(p, "local: this process; ray: --workers model replicas on Ray (the `scale` extra)")
    return p


def main(argv: list[str] | None = None) -> None:
    """CLI entry point; user mistakes end with one line on stderr and exit status 1."""
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    interrupt_on_sigterm()
    skip_exit_collection()
    try:
        run(args)
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        sys.exit(1)
    except KeyboardInterrupt as err:
        kept = str(err) if isinstance(err, KeptLines) else f"nothing was written to {args.output or 'the outputs'}"
        print(f"interrupted: {kept}", file=sys.stderr)
        # 128 + the signal, as a shell reports it: SIGTERM's `Interrupted` knows its number; Ctrl-C is SIGINT
        sys.exit(128 + getattr(err.__cause__ if isinstance(err, KeptLines) else err, "signum", signal.SIGINT))
    except ValueError as err:  # bad values and files
        sys.exit(f"error: {err}")
    except OSError as err:  # missing, unreadable or unwritable files, a full disk
        sys.exit(f"error: {err if err.errno is None else describe_os_error(err)}")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name!r}: not a device; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name}: no CUDA GPU is available here; use --device cpu")
    return device


def _check(args: argparse.Namespace) -> tuple[SearchOptions, Layer]:
    """The search options and the alignment layer; bad values and paths are one-line errors before any work."""
    options = SearchOptions(args.beam_size, args.n_best, args.alpha, args.max_len_a, args.max_len_b, args.batch_size)
    if args.chunk_lines < 1 or args.html_max < 0:
        raise InputError(f"--chunk-lines ({args.chunk_lines}) must be >= 1 and --html-max ({args.html_max}) >= 0")
    if args.input == "-":
        args.input = None  # stdin, as most Unix tools read it
    if args.input is not None and Path(args.input).is_dir():
        raise IsADirectoryError(f"--input {args.input}: is a folder; name a file of source lines")
    if args.input is not None and not Path(args.input).exists():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    try:
        return options, "mean" if args.align_layer == "mean" else int(args.align_layer)
    except ValueError:
        raise InputError(f"--align-layer must be an integer or 'mean', got {args.align_layer!r}") from None


def run(args: argparse.Namespace) -> None:
    """Translate `args.input` (or stdin) into `args.output` (or stdout); see the module docstring."""
    options, layer = _check(args)
    with contextlib.ExitStack() as locks:
        if args.output and Path(args.output).parent.is_dir() and not Path(args.output).is_dir():
            locks.enter_context(OutputLock(args.output, "translate.infer"))  # one writer per output file
            for path in filter(None, (args.output, args.alignments, args.html)):
                for tmp in stale_temporaries(path):  # left by a run killed with -9; we hold the lock
                    tmp.unlink()
        _translate(args, options, layer)


def _translate(args: argparse.Namespace, options: SearchOptions, layer: Layer) -> None:
    shard = parse_shard(args.shard) if args.shard else None
    want_align = args.alignments is not None or args.html is not None
    if args.engine == "ray" and want_align:
        raise InputError("--engine ray writes the translations only; drop --alignments/--html or use --engine local")
    if shard and not (args.input and args.output):
        raise InputError(f"--shard {args.shard} needs -i FILE and -o PART: each shard reads the file and writes a part")
    cpu_only = args.dtype == INT8 or args.engine == "ray"
    device = torch.device("cpu") if cpu_only and args.device == "auto" else _device(args.device)
    if args.engine == "ray" and device.type != "cpu":
        raise InputError(f"--engine ray runs its workers on CPUs; drop --device {args.device} or use --engine local")
    translator = Translator.load(args.ckpt, device, args.dtype) if args.engine == "local" else None
    if translator is not None:
        n_layers = attention_layers(translator.aligner.decoder, "cross_attn")  # 1 for an RNN
        if layer != "mean" and not -n_layers <= layer < n_layers:  # before any output is written
            raise InputError(f"--align-layer {layer}: the model has {n_layers} decoder cross-attention "
                             f"layer{'s' if n_layers != 1 else ''} (use 0..{n_layers - 1}, -1 for the last, or mean)")
    shown: list[tuple[int, WordAlignment]] = []
    warned = [0]
    with AtomicOutputs() as outputs, contextlib.ExitStack() as stack:
        partial = None
        if args.input and args.output and not want_align and _plain_file(Path(args.output)):
            # resumable: the lines are kept as they are written
            partial, done = _resume(Path(args.output), _settings(args, options, shard, local=True), args.fresh)
            out = stack.enter_context(open(partial, "ab"))
        else:
            out, done = outputs.open(args.output) if args.output else sys.stdout.buffer, 0
        align_out = outputs.open(args.alignments) if args.alignments else None
        html_out = outputs.reserve(args.html) if args.html else None  # a bad path fails now, not after the work
        stream = stack.enter_context(open(args.input, "rb")) if args.input else sys.stdin.buffer
        advance = stack.enter_context(_progress(args.progress or sys.stderr.isatty(), args.input, done))
        read = [0]  # the input's lines, counted as they are read (a part's record names them)
        chunks = (read.__setitem__(0, read[0] + len(c)) or c
                  for c in read_chunks(stream, args.chunk_lines, args.input or "<stdin>", CHUNK_BYTES))
        runs = shard_runs(chunks, args.chunk_lines, shard, done)
        if translator is None:
            cluster = RayCluster(args.workers, args.cpus_per_worker, args.ray_address)
            results = translate_on_ray(runs, args.ckpt, str(device), args.dtype, options, cluster, warned)
        else:
            results = _local(translator, runs, options, layer if want_align else None, warned)
        written = done
        try:
            for first, lines, text, aligned in results:
                out.write(text.encode("utf-8"))
                out.flush()
                written += len(lines)
                if aligned is not None:
                    if align_out is not None:
                        align_out.write("".join(a.to_json() + "\n" for a in aligned).encode("utf-8"))
                    room = args.html_max - len(shown)
                    shown += [(first + k, a) for k, a in enumerate(aligned) if a.tgt_words][: max(room, 0)]
                advance(len(lines))
                del lines, text, aligned  # else this chunk stays alive while the next one is read and translated
        except KeyboardInterrupt as err:
            if partial is None:
                raise
            raise KeptLines(f"{written} translated lines of {args.output} are kept in {partial}; the same "
                              "command continues from there (--fresh starts over)") from err
        except Exception:
            if partial is not None:  # a bad line: the fixed input is another input, so nothing is worth keeping
                for path in (partial, partial.with_name(partial.name + ".json")):
                    path.unlink(missing_ok=True)
            raise
        if warned[0] > (MAX_TRUNCATION_WARNINGS if translator else 0):
            log.warning("%d lines in all were truncated to the model's max_len", warned[0])
        if html_out is not None:
            write_html(html_out, [a for _, a in shown], f"Alignments: {args.input or 'stdin'}", [n for n, _ in shown])
        if partial is not None:
            out.close()
            os.replace(partial, args.output)
            partial.with_name(partial.name + ".json").unlink()
            if shard is not None:
                record = _settings(args, options, shard, local=False)
                write_record(Path(args.output), {**record, "input_lines": read[0]})
    log.info("translated %d lines", written)


class KeptLines(KeyboardInterrupt):
    """An interruption that kept the lines already written, and says so; its cause is the signal's exception."""


def _local(translator: Translator, runs: Iterable[tuple[int, list[str]]], options: SearchOptions,
           layer: Layer | None, warned: list[int]) -> Iterator[tuple[int, list[str], str, list | None]]:
    for first, lines in runs:
        yield first, lines, *translator.translate_chunk(lines, options, first, warned, layer)


def _settings(args: argparse.Namespace, options: SearchOptions, shard: Shard | None, local: bool) -> dict:
    """What shapes the output's lines: a resumed run must match it (`local`: with paths and modification times),
    and a merge checks the parts' records (without them, so parts from several machines merge)."""
    def file(path: str) -> list:
        stat = Path(path).stat()
        return [str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns] if local else [Path(path).name, stat.st_size]

    return {"input": file(args.input), "checkpoints": [file(c) for c in args.ckpt], "search": asdict(options),
            "dtype": args.dtype, "block": args.chunk_lines, "shard": shard and f"{shard[0]}/{shard[1]}"}


def _resume(output: Path, settings: dict, fresh: bool) -> tuple[Path, int]:
    """The hidden partial output beside `output` and the lines it holds: an earlier run's with the same settings
    (cut after its last whole line), or a new, empty one."""
    partial, record = output.with_name(f".{output.name}.partial"), output.with_name(f".{output.name}.partial.json")
    if not fresh and partial.is_file() and record.is_file() and json.loads(record.read_text()) == settings:
        lines, end = 0, 0
        with open(partial, "rb") as f:
            for at, block in enumerate(iter(lambda: f.read(1 << 20), b"")):
                lines += block.count(b"\n")
                if (last := block.rfind(b"\n")) >= 0:
                    end = (at << 20) + last + 1
        os.truncate(partial, end)
        log.info("resuming %s: %d lines were translated by an earlier run", output, lines)
        return partial, lines
    partial.write_bytes(b"")
    record.write_text(json.dumps(settings))
    return partial, 0


def _plain_file(path: Path) -> bool:
    """A new or regular file in a folder that exists: not a folder, a link written through or a FIFO, which
    `core.runtime.atomic_path` handles (and refuses a missing folder in its own words)."""
    return path.parent.is_dir() and not path.is_symlink() and (path.is_file() or not path.exists())


def _count_lines(path: Path) -> int:
    """Lines as `read_chunks` counts them: a last line without a line break is one."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines, last = lines + block.count(b"\n"), block[-1:]
    return lines + (last != b"\n")


@contextlib.contextmanager
def _progress(enabled: bool, path: str | None, done: int = 0) -> Iterator[Callable[[int], None]]:
    """A rich progress bar of lines on stderr (advanced by the function it gives); a no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("translating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True)) as bar:
        # stdin or a pipe: an open-ended bar (counting would consume it)
        total = _count_lines(Path(path)) if path is not None and Path(path).is_file() else None
        task = bar.add_task("lines", total=total, completed=done)
        yield lambda n: bar.advance(task, n)


if __name__ == "__main__":
    main()
