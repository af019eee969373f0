"""The seed textbook's complete training example, rebuilt on `core`.

An encoder classifier finds which of 10 class-specific 5-token patterns is planted in a
random sequence. Architecture and recipe follow the seed exactly: token embedding x
sqrt(d), sinusoidal positions, 3 pre-LN blocks (d_model 128, 4 heads, d_ff 512, dropout
0.1), masked mean pooling, linear head; 10,000 sequences (length 64, vocabulary 100,
8,000 / 2,000 split); AdamW lr 1e-3, weight decay 0.01; 200 warmup steps then cosine;
gradient-norm clip 1.0; batch 64; 20 epochs. The seed reports 99.35% validation
accuracy; the target is >= 99%.

    python benchmarks/seed_pattern.py                      # full recipe (a few minutes on CPU)
    python benchmarks/seed_pattern.py --epochs 5 --json out.json

Legend: B batch, T time (64), D model width, C classes.
"""

from __future__ import annotations

import argparse
import json
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from core.nn import Encoder, TokenEmbedding, WarmupCosineLR, padding_mask

PAD_ID = 0


def make_pattern_data(
    num_sequences: int = 10_000, seq_len: int = 64, vocab_size: int = 100, num_classes: int = 10,
    pattern_len: int = 5, seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Random token sequences, each with its class's 5-token pattern planted at a random position.

    Token 0 is reserved for padding, so sequences use ids 1..vocab_size-1.

    Returns:
        ids (N, T) int64 and labels (N,) int64.
    """
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randint(1, vocab_size, (num_classes, pattern_len), generator=g)
    ids = torch.randint(1, vocab_size, (num_sequences, seq_len), generator=g)
    labels = torch.randint(0, num_classes, (num_sequences,), generator=g)
    starts = torch.randint(0, seq_len - pattern_len + 1, (num_sequences,), generator=g)
    cols = starts[:, None] + torch.arange(pattern_len)  # (N, pattern_len)
    ids.scatter_(1, cols, patterns[labels])
    return ids, labels


class PatternClassifier(nn.Module):
    """Encoder classifier: embeddings, a bidirectional core Encoder, masked mean pooling, a linear head."""

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 128, n_heads: int = 4, d_ff: int = 512,
                 n_layers: int = 3, dropout: float = 0.1, max_len: int = 64):
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, d_model, pad_id=PAD_ID)
        self.encoder = Encoder(d_model, n_heads, n_layers=n_layers, d_ff=d_ff, dropout=dropout, max_len=max_len,
                               positions="sinusoidal")
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, ids: Tensor) -> Tensor:
        """(B, T) ids -> (B, C) logits."""
        mask = padding_mask(ids, PAD_ID)  # (B, 1, 1, T)
        h = self.encoder(self.embed(ids), mask)  # (B, T, D)
        keep = mask[:, 0, 0, :, None].to(h.dtype)  # (B, T, 1)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)  # (B, D)
        return self.head(pooled)


class PatternModule(L.LightningModule):
    """The seed's training recipe as a LightningModule."""

    def __init__(self, vocab_size: int = 100, num_classes: int = 10, lr: float = 1e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 200, total_steps: int = 2500):
        super().__init__()
        self.save_hyperparameters()
        self.model = PatternClassifier(vocab_size, num_classes)

    def training_step(self, batch: tuple[Tensor, Tensor], _: int) -> Tensor:
        ids, labels = batch
        loss = F.cross_entropy(self.model(ids), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], _: int) -> None:
        ids, labels = batch
        logits = self.model(ids)
        self.log("val_loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.log("val_acc", (logits.argmax(-1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        sched = WarmupCosineLR(opt, self.hparams.warmup_steps, total_steps=self.hparams.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class _EpochLog(L.Callback):
    """Prints one line per epoch (validation accuracy is what the seed reports)."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        print(f"epoch {trainer.current_epoch + 1:2d}  val_loss {float(m['val_loss']):.4f}  "
              f"val_acc {100 * float(m['val_acc']):.2f}%", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20, help="training epochs (seed: 20)")
    p.add_argument("--num-sequences", type=int, default=10_000, help="dataset size, 80/20 split (seed: 10,000)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--precision", default="32-true", help="Lightning precision, e.g. bf16-mixed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", metavar="PATH", help="write the figures as one flat JSON object")
    args = p.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, verbose=False)
    ids, labels = make_pattern_data(args.num_sequences, seed=args.seed)
    n_train = int(0.8 * len(ids))
    train = DataLoader(TensorDataset(ids[:n_train], labels[:n_train]), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(TensorDataset(ids[n_train:], labels[n_train:]), batch_size=256)
    module = PatternModule(total_steps=args.epochs * len(train))
    n_params = sum(p.numel() for p in module.parameters())
    print(f"seed pattern task: {n_train} train / {len(ids) - n_train} val sequences, {n_params:,} parameters, "
          f"{args.epochs} epochs, precision {args.precision}, {torch.get_num_threads()} threads")
    trainer = L.Trainer(
        max_epochs=args.epochs, gradient_clip_val=1.0, precision=args.precision, logger=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[_EpochLog()],
        enable_progress_bar=False,
    )
    start = time.perf_counter()
    trainer.fit(module, train, val)
    seconds = time.perf_counter() - start
    acc = 100 * float(trainer.callback_metrics["val_acc"])
    figures = {
        "val_acc_pct": round(acc, 2), "seed_val_acc_pct": 99.35, "epochs": args.epochs,
        "train_seconds": round(seconds, 1), "train_seq_per_s": round(args.epochs * n_train / seconds, 1),
        "parameters": n_params,
    }
    print(f"\n{'metric':<22}{'ours':>12}{'seed':>12}")
    print(f"{'val accuracy (%)':<22}{acc:>12.2f}{99.35:>12.2f}")
    print(f"{'train wall time (s)':<22}{seconds:>12.1f}{'':>12}")
    if args.epochs >= 20 and args.num_sequences >= 10_000:
        print(f"{'target >= 99%':<22}{'met' if acc >= 99.0 else 'NOT met':>12}")
    else:
        print("(a shortened run: the >= 99% target applies to the full recipe, 20 epochs on 10,000 sequences)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
