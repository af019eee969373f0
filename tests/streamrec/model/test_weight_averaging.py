"""Lightning's EMAWeightAveraging on StreamRec: it copies the module before `setup` fills the item counts, so
every buffer must already have its final shape; validation then runs on the averaged weights."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging

from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule


def test_ema_validates_the_average_and_leaves_the_trained_weights(tiny_log, tmp_path):
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=32)
    module = StreamRecModule(num_items=data.num_items, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    ema = EMAWeightAveraging(decay=0.5)
    seen = {}

    class Probe(L.Callback):
        def on_validation_epoch_start(self, trainer, pl_module):
            seen["validated"] = pl_module.model.item_embedding.weight.detach().clone()

    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[ema, Probe()], default_root_dir=tmp_path,
                        num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.item_counts.sum() > 0  # filled by setup, in place
    assert "val_mostpop_ndcg@10" in trainer.callback_metrics  # the averaged copy kept the counts
    # Validated weights are the average, not the last step's; after fit, the average is copied into the module.
    torch.testing.assert_close(module.model.item_embedding.weight, seen["validated"])
