"""Export a trained StreamRec model: safetensors weights, or an ONNX scoring graph (docs/export.md).

    python -m streamrec.export --ckpt CKPT --format safetensors --output DIR
    python -m streamrec.export --ckpt CKPT --format onnx --output DIR

`safetensors` writes DIR/model.safetensors and DIR/config.json (the module's hyper-parameters and the
item vocabulary); `streamrec.Recommender.load(DIR)` reads it back without pickle (`core.runtime.export`).
`onnx` writes DIR/model.onnx, `items (B, T) -> scores (B, N+1)` over model ids left-padded to max_len (the
positions count from the first column), and DIR/items.json (`max_len`, and `items[k]`: the original id of
model id k + 1). It needs the `export` extra (`pip install -c constraints.txt -e ".[export]"`).

Legend: B users, T history length, N items."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor, nn

from core.nn.cpu_fastpath import cpu_fastpath_disabled
from core.runtime.atomic import atomic_folder_files
from core.runtime.checkpoint import load_module
from core.runtime.errors import exit_on_error
from core.runtime.export import constructor_arguments, run_export, save_folder, write_json
from core.runtime.lock import interrupt_on_sigterm
from streamrec.data.ingest.options import READ_OPTIONS_KEY
from streamrec.data.readers import read_options_from_checkpoint
from streamrec.data.vocab import ItemVocab
from streamrec.model.module import VOCAB_KEY, StreamRecModule
from streamrec.model.network import StreamRecModel

WRITTEN_BY = "python -m streamrec fit"
FORMATS = ("safetensors", "onnx")
ONNX_FILE = "model.onnx"
ITEMS_FILE = "items.json"
OPSET = 18


class ScoringGraph(nn.Module):
    """What the ONNX graph computes: next-item scores after each left-padded history."""

    def __init__(self, model: StreamRecModel):
        super().__init__()
        self.model = model

    def forward(self, items: Tensor) -> Tensor:
        """(B, T) model item ids, left-padded with 0 -> (B, N+1) scores, column 0 -inf."""
        return self.model.score(self.model.last_hidden(items))


def load(ckpt: str | Path) -> tuple[StreamRecModule, dict]:
    """The module and the checkpoint dict of a `python -m streamrec fit` checkpoint (restricted unpickler)."""
    return load_module(StreamRecModule, ckpt, WRITTEN_BY, "StreamRec", required=[VOCAB_KEY])


def export_safetensors(ckpt: str | Path, out: str | Path) -> Path:
    """Write DIR/model.safetensors and DIR/config.json (hyper-parameters + `items`); returns the folder."""
    module, state = load(ckpt)
    vocab = ItemVocab.from_dict(state[VOCAB_KEY])
    hparams = constructor_arguments(StreamRecModule, state["hyper_parameters"])
    # {"items": [...]}, and how the training log was read, so that new logs are read the same way from the folder
    reading = {READ_OPTIONS_KEY: read_options_from_checkpoint(state).to_dict()}
    return save_folder(out, module.model, "streamrec", hparams, {**vocab.to_dict(), "data": reading})


def export_onnx(ckpt: str | Path, out: str | Path, opset: int = OPSET) -> Path:
    """Write DIR/model.onnx (dynamic batch and length) and DIR/items.json; returns the folder."""
    module, state = load(ckpt)
    model = module.model.float().eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_onnx(model, out / ONNX_FILE, opset)
    write_json(out / ITEMS_FILE, {"max_len": model.max_len, **ItemVocab.from_dict(state[VOCAB_KEY]).to_dict()})
    return out


def write_onnx(model: StreamRecModel, path: Path, opset: int = OPSET) -> None:
    """Export `ScoringGraph(model)` to `path` with torch's dynamo-based exporter (dynamic B, T <= max_len): the
    TorchScript one fails on SDPA's `enable_gqa` flag. The CPU fast path's oneDNN op has no ONNX form, so plain
    layers run while exporting."""
    graph, t = ScoringGraph(model).eval(), model.max_len
    example = torch.zeros(2, t, dtype=torch.long)  # two left-padded histories of different lengths
    example[0, :] = torch.arange(t) % model.num_items + 1
    example[1, t // 2 :] = torch.arange(t - t // 2) % model.num_items + 1
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=model.max_len)
    # The graph names its weights file after the path it is written to: written under its final name in a
    # folder of its own, then moved beside `path`, it names `model.onnx.data`, which travels with it.
    with atomic_folder_files(path) as tmp, torch.no_grad(), cpu_fastpath_disabled(model):
        torch.onnx.export(graph, (example,), str(tmp), input_names=["items"], output_names=["scores"],
                          dynamic_shapes={"items": {0: batch, 1: length}}, opset_version=opset, dynamo=True,
                          verbose=False, external_data=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m streamrec.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint written by `python -m streamrec fit`")
    p.add_argument("--format", required=True, choices=FORMATS, help="safetensors (weights + config.json) or onnx")
    p.add_argument("--output", required=True, help="folder to write (created if missing)")
    p.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    args = p.parse_args(argv)
    write = {"safetensors": lambda: export_safetensors(args.ckpt, args.output),
             "onnx": lambda: export_onnx(args.ckpt, args.output, args.opset)}[args.format]
    interrupt_on_sigterm()
    with exit_on_error(interrupted=f"rerun the command to export {args.output} whole"):
        run_export(write, args.format, args.output)


if __name__ == "__main__":
    main()
