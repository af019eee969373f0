"""TranslationModule: the loss against a hand computation, its config checks, and the BLEU helpers."""

from __future__ import annotations

import dataclasses
import inspect
import io

import pytest
import torch
import torch.nn.functional as F

import translate.model.networks
from core.nn.options import SpeedOptions
from translate.data.corpus import Batch, TranslationDataModule
from translate.data.vocab import PAD_ID, train_vocab
from translate.model.module import TranslationModule, corpus_scores, translation_loss, vocabs_from_checkpoint
from translate.model.networks import ARGUMENTS, GROUPS, NETWORKS, accepted_keys, network_arguments
from translate.model.options import AdamWOptions, LossOptions, TransformerOptions
from translate.model.transformer import MAX_LEN, TransformerTranslator

PAD, BOS, EOS = 0, 2, 3


def _module(**kwargs) -> TranslationModule:
    torch.manual_seed(0)
    args = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, n_encoder_layers=1,
                n_decoder_layers=1, d_ff=32, dropout=0.0, max_len=16)
    return TranslationModule(**{**args, **kwargs}).eval()


def _batch() -> Batch:
    return Batch(
        src=torch.tensor([[5, 6, 7], [8, 9, PAD]]),
        tgt_in=torch.tensor([[BOS, 4, 5, 6], [BOS, 7, PAD, PAD]]),
        tgt_out=torch.tensor([[4, 5, 6, EOS], [7, EOS, PAD, PAD]]),
        index=torch.tensor([0, 1]),
    )


def _hand_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> float:
    """Per token: (1 - eps) * -log p(gold) + eps * mean over all V of -log p(v); mean over non-pad tokens."""
    total, count = 0.0, 0
    logp = logits.double().log_softmax(-1)
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            gold = int(target[b, t])
            if gold == PAD:
                continue
            row = logp[b, t]
            total += (1 - eps) * -float(row[gold]) + eps * -float(row.mean())
            count += 1
    return total / count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_equals_hand_computed_label_smoothed_cross_entropy(eps):
    module, batch = _module(objective={"label_smoothing": eps}), _batch()
    with torch.no_grad():
        logits = module.model(batch.src, batch.tgt_in)
        loss = module.compute_loss(batch)
    assert float(loss) == pytest.approx(_hand_loss(logits, batch.tgt_out, eps), abs=1e-5)


def test_padding_positions_do_not_change_the_loss():
    module, batch = _module(objective=LossOptions(label_smoothing=0.1)), _batch()
    changed = Batch(**{**vars(batch), "tgt_in": batch.tgt_in.clone()})
    changed.tgt_in[1, 2:] = torch.tensor([8, 9])  # tokens at padded target positions
    with torch.no_grad():
        assert float(module.compute_loss(batch)) == pytest.approx(float(module.compute_loss(changed)), abs=1e-6)


def test_loss_gradients_equal_autograd_through_cross_entropy_on_logits():
    batch = _batch()
    ours, reference = _module(objective={"label_smoothing": 0.1}), _module(objective={"label_smoothing": 0.1})
    ours.compute_loss(batch).backward()
    logits = reference.model(batch.src, batch.tgt_in)
    F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD, label_smoothing=0.1).backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_post_ln_and_options_reach_the_model():
    options = dict(activation="gelu", positions="learned", n_kv_heads=1)
    post, pre = _module(block={"norm_first": False, **options}), _module(block=TransformerOptions(**options))
    residuals = [m for m in post.model.modules() if hasattr(m, "norm_first")]
    assert len(residuals) == 2 + 3  # encoder: attention + feed-forward; decoder: self, cross, feed-forward
    assert not any(m.norm_first for m in residuals)
    assert isinstance(post.model.encoder.norm, torch.nn.Identity)  # post-LN has no final norm
    assert post.model.encoder.layers[0].ff.activation == "gelu"
    assert post.model.decoder.layers[0].self_attn.n_kv_heads == 1
    # same weights, other norm placement: other outputs
    pre.load_state_dict(post.state_dict(), strict=False)
    batch = _batch()
    assert not torch.allclose(post.model(batch.src, batch.tgt_in), pre.model(batch.src, batch.tgt_in))
    assert post.compute_loss(batch).isfinite()


def test_rdrop_training_loss_equals_both_passes_scored_by_hand():
    """With R-Drop the batch runs twice with different dropout masks; the same seed replays them."""
    module, batch = _module(dropout=0.3, objective={"label_smoothing": 0.1, "rdrop_alpha": 5.0}).train(), _batch()
    torch.manual_seed(1)
    ours = translation_loss(module.model, batch, PAD, 0.1, rdrop_alpha=5.0)
    torch.manual_seed(1)
    with torch.no_grad():  # the same masks: dropout draws do not depend on grad mode
        logits = module.model(batch.src.repeat(2, 1), batch.tgt_in.repeat(2, 1)).double().chunk(2)
    keep = batch.tgt_out != PAD
    a, b = logits[0][keep], logits[1][keep]
    assert not torch.allclose(a, b)  # two dropout masks
    ce = sum(_hand_loss(x[None], batch.tgt_out[keep][None], 0.1) for x in (a, b)) / 2
    pa, pb = a.softmax(-1), b.softmax(-1)
    sym_kl = ((pa * (pa / pb).log()).sum(-1) + (pb * (pb / pa).log()).sum(-1)).mean()
    assert float(ours) == pytest.approx(ce + 5.0 / 4 * float(sym_kl), rel=1e-5)
    module.eval()  # no dropout: validation's loss is the plain cross-entropy
    with torch.no_grad():
        assert float(module.compute_loss(batch)) == pytest.approx(
            float(translation_loss(module.model, batch, PAD, 0.1, rdrop_alpha=5.0)), abs=1e-5)


@pytest.mark.parametrize("bad", [dict(objective={"label_smoothing": 1.0}), dict(evaluation={"val_beam_size": 0}),
                                 dict(n_heads=3), dict(objective={"rdrop_alpha": -1.0}),
                                 dict(optimizer={"betas": [0.9]}), dict(rnn={"hidden_size": 0})])
def test_bad_settings_are_value_errors(bad):
    with pytest.raises(ValueError):
        _module(**bad)


def test_a_key_a_group_does_not_have_is_refused_in_one_line_naming_its_keys():
    with pytest.raises(ValueError) as err:
        _module(optimizer={"warmup": 10})
    message = str(err.value)
    assert "\n" not in message and "`model.optimizer` has no key 'warmup'" in message and "warmup_steps" in message


@pytest.mark.parametrize("old", ["warmup_steps", "val_beam_size", "attention", "cell", "cpu_fastpath", "compile"])
def test_the_flat_names_of_older_checkpoints_are_not_options(old):
    """They live on only inside the loader (`translate.model.hparams.upgrade_hparams`)."""
    assert old not in inspect.signature(TranslationModule).parameters
    with pytest.raises(TypeError, match=old):
        TranslationModule(**{old: 1})


def test_checkpoints_hold_the_groups_as_plain_dicts():
    """What `save_hyperparameters` stored loads with torch.load(weights_only=True): no dataclass in a checkpoint."""
    module = _module(block=TransformerOptions(n_kv_heads=1), optimizer=AdamWOptions(warmup_steps=3),
                     speed=SpeedOptions(cpu_fastpath=False))
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": dict(module.hparams)}, buffer)
    buffer.seek(0)
    stored = torch.load(buffer, weights_only=True)["hyper_parameters"]
    assert stored["block"]["n_kv_heads"] == 1 and stored["optimizer"]["warmup_steps"] == 3
    assert stored["optimizer"]["betas"] == [0.9, 0.98]  # tuples as lists
    assert list(stored) == list(inspect.signature(TranslationModule).parameters)
    assert TranslationModule(**stored).optimizer == module.optimizer  # and builds the same module back


def test_separate_vocabularies_need_share_embeddings_false():
    with pytest.raises(ValueError, match="share_embeddings"):
        _module(tgt_vocab_size=13)
    assert _module(tgt_vocab_size=13, share_embeddings=False).compute_loss(_batch()).isfinite()


def test_corpus_scores_are_sacrebleu():
    refs = ["der Hund schläft .", "die Katze sieht den Hund ."]
    bleu, chrf, signature = corpus_scores(refs, refs)
    assert bleu == pytest.approx(100.0) and chrf == pytest.approx(100.0)
    assert "tok:13a" in signature and "case:mixed" in signature
    lower, _, signature = corpus_scores([r.upper() for r in refs], refs, lowercase=True)
    assert lower == pytest.approx(100.0) and "case:lc" in signature


def test_vocabularies_are_read_from_the_data_module_key():
    vocab = train_vocab(["der Hund schläft .", "the dog sleeps ."] * 5, 40, cache_dir=None)
    ckpt = {"TranslationDataModule": {"src_vocab": vocab.to_bytes(), "tgt_vocab": vocab.to_bytes()}}
    src, tgt = vocabs_from_checkpoint(ckpt)
    assert src == vocab and tgt is src
    assert vocabs_from_checkpoint({"OtherDataModule": ckpt["TranslationDataModule"]})[0] == vocab
    assert vocabs_from_checkpoint({"state_dict": {}, "streamrec_item_vocab": {"items": []}}) is None
    module = _module()
    module.on_load_checkpoint(ckpt)
    assert module.tgt_vocab == vocab


@pytest.mark.parametrize("name", ["dropout", "block.attn_dropout", "block.ff_dropout"])
def test_a_dropout_outside_zero_one_is_an_error_naming_its_key(name: str) -> None:
    group, _, key = name.rpartition(".")
    with pytest.raises(ValueError, match=rf"`model\.{name}` \(1\.5\) must be a probability in \[0, 1\]"):
        TranslationModule(**({group: {key: 1.5}} if group else {key: 1.5}))


def test_ff_dropout_reaches_every_feed_forward_and_defaults_to_dropout() -> None:
    split = TranslationModule(dropout=0.3, block={"ff_dropout": 0.0})
    same = TranslationModule(dropout=0.3)
    for module, p in ((split, 0.0), (same, 0.3)):
        layers = [*module.model.encoder.layers, *module.model.decoder.layers]
        assert [layer.ff.drop.p for layer in layers] == [p] * len(layers)
        assert all(layer.ff_block.drop.p == 0.3 for layer in layers)  # the residual dropout stays


@pytest.mark.parametrize("warmup", [1, 4])
def test_inverse_sqrt_schedule_is_fairseqs(warmup: int) -> None:
    """fairseq's inverse_sqrt (warmup_init_lr 0): lr * step / warmup, then lr * sqrt(warmup) * step ** -0.5."""
    conf = _module(optimizer={"schedule": "inverse_sqrt", "warmup_steps": warmup}, lr=0.005).configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step"
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    decay = 0.005 * warmup**0.5
    assert seen == pytest.approx([0.005 * s / warmup if s < warmup else decay * s**-0.5 for s in range(12)])


@pytest.mark.parametrize(("bad", "key"), [
    (dict(schedule="linear"), "model.optimizer.schedule"),
    (dict(schedule="inverse_sqrt", warmup_steps=0), "model.optimizer.warmup_steps")])
def test_a_bad_schedule_is_an_error_naming_its_key(bad: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"`{key}`"):
        _module(optimizer=bad)


def test_every_model_argument_reaches_the_model_under_its_own_name(monkeypatch) -> None:
    """The module hands the network its top-level arguments and its `block` group by keyword; a dropped or renamed
    one fails here."""
    seen: dict = {}

    class Spy(TransformerTranslator):
        def __init__(self, src_vocab_size, tgt_vocab_size, **kwargs):
            seen.update(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, **kwargs)
            super().__init__(src_vocab_size, tgt_vocab_size, **kwargs)

    monkeypatch.setitem(translate.model.networks.NETWORKS, "transformer", Spy)
    block = dict(n_kv_heads=1, positions="rope", norm_first=False, activation="gelu", ff_dropout=0.0, attn_dropout=0.1)
    module = _module(block=block, share_embeddings=False, tgt_vocab_size=12)
    expected = {name: module.hparams[name] for name in ("src_vocab_size", "tgt_vocab_size", *ARGUMENTS["transformer"])}
    assert seen == {**expected, **block}
    assert set(seen) == set(inspect.signature(TransformerTranslator).parameters)


@pytest.mark.parametrize("arch", sorted(NETWORKS))
def test_each_network_is_handed_exactly_its_own_arguments(arch) -> None:
    """The handoff's lists are the networks' signatures; the module's signature is every key the handoff knows."""
    name, group = GROUPS[arch]
    defaults = {n: p.default for n, p in inspect.signature(TranslationModule).parameters.items()}
    cls, kwargs = network_arguments({**defaults, "arch": arch})
    own = [p for p in inspect.signature(cls).parameters if p not in ("src_vocab_size", "tgt_vocab_size")]
    assert cls is NETWORKS[arch] and sorted(kwargs) == sorted(own)
    assert sorted(own) == sorted([*ARGUMENTS[arch], *(f.name for f in dataclasses.fields(group))])
    assert accepted_keys() == list(inspect.signature(TranslationModule).parameters)


def test_the_handoff_refuses_an_unknown_key_in_one_line() -> None:
    with pytest.raises(ValueError) as err:
        network_arguments({"arch": "rnn", "hidden_size": 16})
    message = str(err.value)
    assert "\n" not in message and "`model.hidden_size`" in message and "src_vocab_size, tgt_vocab_size" in message
    with pytest.raises(ValueError, match="`model.rnn` has no key 'attention'"):
        network_arguments({"arch": "rnn", "rnn": {"attention": "dot"}})


def test_model_module_and_data_share_their_defaults() -> None:
    """One home for defaults: `translate.model.transformer.MAX_LEN` (the data's `max_len` is linked into the model's),
    `translate.data.vocab.PAD_ID`, and the module's and its groups' defaults are the networks'."""
    module = inspect.signature(TranslationModule).parameters
    assert inspect.signature(TranslationDataModule).parameters["max_len"].default == MAX_LEN
    assert module["max_len"].default == MAX_LEN and module["pad_id"].default == PAD_ID
    for arch, cls in NETWORKS.items():
        model = inspect.signature(cls).parameters
        group_name, _ = GROUPS[arch]
        defaults = {**{n: module[n].default for n in ARGUMENTS[arch]},
                    **dataclasses.asdict(module[group_name].default)}
        assert {n: p.default for n, p in model.items() if n in defaults} == defaults


def test_vocabularies_are_read_from_where_lightning_stores_the_data_modules_state():
    from translate.data.corpus import TranslationDataModule
    from translate.data.vocab import VOCAB_KEY

    assert VOCAB_KEY == TranslationDataModule.__qualname__
