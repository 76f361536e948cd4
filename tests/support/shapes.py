"""The attention tests' shapes: (B, H, H_kv, L, D, block), with odd lengths, a block longer than
the sequence, blocks of one, and grouped KV heads."""

SHAPES = [
    (1, 8, 8, 128, 32, 64),
    (2, 4, 4, 37, 16, 8),
    (3, 2, 2, 100, 8, 128),
    (1, 1, 1, 1, 4, 16),
    (2, 3, 3, 17, 8, 1),
    (1, 8, 2, 65, 16, 16),
    (2, 4, 1, 50, 8, 7),
]
