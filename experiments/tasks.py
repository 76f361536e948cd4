"""The tasks octlm trains on (exp017_recall, exp019_precision, a training experiment of one's
own): each gives batch(generator, size, held_out) -> (tokens, targets), each (size, length),
targets IGNORE at a position without one, and its length, vocab_size and chance accuracy.

Recall (task="recall"): each sequence holds `pairs` key-value pairs (distinct keys out of
`keys`, values out of `values`), then `gap` filler tokens, then `queries` of those keys (distinct),
each followed by its value. The loss and the accuracy count the answers only: at a query, the
next token is its value. Chance is 1 / values. With pair_tokens (the default) a pair is one
token that names both its key and its value, so one attention layer can answer (a query looks
up the pair with its key); without, a pair is a key token followed by a value token, which needs
an induction circuit (a previous-token head, then a matching one): it learns far more slowly.
Sequences are drawn on the fly from a generator seeded by `seed`; the held-out evaluation set is
drawn once from another. Through the layers a window of w keys reaches layers * (w - 1)
positions back: at most the gap, and every pair is out of the queries' sight.

Text (task="text"): next-character prediction on a UTF-8 file (`text_file`): windows of `length`
characters from its first 90% for training, the last 10% held out; accuracy over every position.
"""

import torch

IGNORE = -100  # a position without a target


class Recall:
    """Multi-query associative recall sequences (see the module's docstring).

    Tokens with pair_tokens: pair (k, v) is k * V + v; a query of key k is K * V + k; an answer
    v is K * V + K + v; the filler is the last token. Without: key k is k, value v is K + v
    (a query repeats its key token, an answer its value token), the filler is K + V."""

    def __init__(self, pairs: int, queries: int, gap: int, keys: int, values: int, pair_tokens):
        self.pairs, self.queries, self.gap = pairs, queries, gap
        self.keys, self.values, self.pair_tokens = keys, values, pair_tokens
        self.chance = 1 / values
        pair_length = pairs if pair_tokens else 2 * pairs
        self.start = pair_length + gap  # where the queries begin
        self.length = self.start + 2 * queries
        if pair_tokens:
            self.query0, self.answer0 = keys * values, keys * values + keys
        else:
            self.query0, self.answer0 = 0, keys
        self.filler = self.answer0 + values
        self.vocab_size = self.filler + 1

    def batch(self, generator: torch.Generator, size: int, held_out: bool = False):
        """(tokens, targets), each (size, length); targets IGNORE except at the queries."""
        keys = torch.rand(size, self.keys, generator=generator).argsort(-1)[:, : self.pairs]
        values = torch.randint(self.values, (size, self.pairs), generator=generator)
        asked = torch.rand(size, self.pairs, generator=generator).argsort(-1)[:, : self.queries]
        asked_keys, answers = keys.gather(1, asked), values.gather(1, asked)
        if self.pair_tokens:
            context = keys * self.values + values
        else:
            context = torch.stack([keys, self.keys + values], -1).flatten(1)
        filler = torch.full((size, self.gap), self.filler)
        questions = torch.stack([self.query0 + asked_keys, self.answer0 + answers], -1).flatten(1)
        tokens = torch.cat([context, filler, questions], 1)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, self.start :: 2] = self.answer0 + answers  # at each query, its answer
        return tokens, targets


class Text:
    """Next-character prediction on a text: random windows of `length` characters, from its
    first 90% for training and from the rest for held-out evaluation."""

    def __init__(self, text: str, length: int):  # at least 10 * (length + 1) characters: check
        alphabet = sorted(set(text))
        self.vocab_size, self.length, self.chance = len(alphabet), length, 1 / len(alphabet)
        index = {char: i for i, char in enumerate(alphabet)}
        encoded = torch.tensor([index[char] for char in text])
        split = len(encoded) * 9 // 10
        self.train, self.held_out = encoded[:split], encoded[split:]

    def batch(self, generator: torch.Generator, size: int, held_out: bool = False):
        source = self.held_out if held_out else self.train
        starts = torch.randint(len(source) - self.length, (size, 1), generator=generator)
        windows = source[starts + torch.arange(self.length + 1)]
        return windows[:, :-1], windows[:, 1:]
