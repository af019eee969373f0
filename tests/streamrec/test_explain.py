"""Explanations against brute force: occlusion by re-running the model, attention properties."""

import torch

from streamrec import Recommender, explain
from streamrec.ranking import explain as views


def test_occlusion_equals_rerunning_without_the_item(tiny_ckpt):
    model = Recommender.load(tiny_ckpt).model
    inputs = torch.tensor([[0, 0, 3, 7, 5, 9, 2, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
    items = torch.tensor([[10, 11], [12, 1]])
    drops = views.occlusion_drops(model, inputs, items)
    for b in range(2):
        base = model.score(model.last_hidden(inputs[b : b + 1]))[0]
        for t in range(8):
            if inputs[b, t] == 0:
                assert (drops[b, :, t] == 0).all()
                continue
            rest = torch.cat([inputs[b, :t], inputs[b, t + 1 :]])
            x = torch.cat([torch.zeros(1, dtype=torch.long), rest])[None]
            occluded = model.score(model.last_hidden(x))[0]
            for k in range(2):
                want = base[items[b, k]] - occluded[items[b, k]]
                assert torch.allclose(drops[b, k, t], want, atol=1e-5)


def test_attention_is_a_distribution_over_real_history(tiny_ckpt):
    model = Recommender.load(tiny_ckpt).model
    inputs = torch.tensor([[0, 0, 0, 3, 7, 5, 9, 2], [1, 2, 3, 4, 5, 6, 7, 8]])
    att = views.attention_weights(model, inputs)
    assert (att[0, :3] == 0).all()
    assert torch.allclose(att.sum(-1), torch.ones(2), atol=1e-5)
    assert (att >= 0).all()


def test_agreement_counts_matching_argmax():
    inputs = torch.tensor([[0, 4, 5, 6]])
    attention = torch.tensor([[0.0, 0.2, 0.5, 0.3]])
    drops = torch.tensor([[[9.0, 0.1, 0.9, 0.2], [9.0, 0.8, 0.1, 0.0]]])  # padding position never counts
    assert views.agreement(attention, drops, inputs) == 0.5


def test_explain_cli_writes_a_self_contained_page(tiny_ckpt, tiny_log, tmp_path):
    from streamrec.data.readers import read_interactions

    user = next(iter(read_interactions(tiny_log).items))
    page = tmp_path / "why.html"
    explain.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--user", user, "--html", str(page),
                  "--top-k", "3"])
    text = page.read_text()
    assert user in text and "data:image/png;base64," in text
    assert "http://" not in text and "https://" not in text  # nothing fetched from elsewhere
