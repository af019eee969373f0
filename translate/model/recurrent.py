"""The recurrent translator network: `core.nn.recurrent`'s encoder and attentional decoder, tied embeddings. It has
`TransformerTranslator`'s interface: search, n-best lists, ensembles and alignments (its decoder's `cross_attn`)
use it."""

from __future__ import annotations

from torch import nn

from core.nn import tie_weights
from core.nn.recurrent import Cell, RecurrentCache, RecurrentDecoder, RecurrentEncoder, Scoring
from translate.data.vocab import PAD_ID
from translate.model.transformer import MAX_LEN, EncoderDecoder, token_embeddings


class RecurrentTranslator(EncoderDecoder):
    """Bidirectional GRU/LSTM encoder, attentional decoder with input feeding, tied embeddings. Args: the network's
    arguments of `translate.model.module.TranslationModule` and its `rnn` group
    (`translate.model.options.RecurrentOptions`), with their names, meanings and defaults (a test keeps the defaults
    equal); `translate.model.networks.build_translator` hands them over. `max_len` only caps the search."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, pad_id: int = PAD_ID, d_model: int = 256,
                 n_encoder_layers: int = 3, n_decoder_layers: int = 3, dropout: float = 0.1, max_len: int = MAX_LEN,
                 share_embeddings: bool = True, cell: Cell = "gru", score: Scoring = "additive",
                 hidden_size: int = 256):
        super().__init__()
        self.pad_id, self.max_len = pad_id, max_len
        self.src_embed, self.tgt_embed = token_embeddings(src_vocab_size, tgt_vocab_size, d_model, pad_id,
                                                          share_embeddings)
        self.encoder = RecurrentEncoder(d_model, hidden_size, n_layers=n_encoder_layers, dropout=dropout, cell=cell)
        self.decoder = RecurrentDecoder(d_model, hidden_size, n_layers=n_decoder_layers, dropout=dropout, cell=cell,
                                        attention=score)
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        tie_weights(self.output, self.tgt_embed)

    @property
    def max_src_len(self) -> int:
        """Longest source the data keeps, in subwords (a recurrent encoder has no position limit)."""
        return self.max_len

    @property
    def max_tgt_len(self) -> int:
        return self.max_len

    def new_cache(self, capacity: int = 16) -> RecurrentCache:
        """An empty decoder state (`capacity` is the transformer's; a recurrent state does not grow)."""
        return self.decoder.new_cache()
