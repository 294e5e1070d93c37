"""``python -m lra.bench fingerprint``: the same code gives the same hash, and any change to the numbers of a
training step (a config value, the training-mode dropout, the variant) changes it."""

from __future__ import annotations

import torch

from lra.bench.fingerprint import fingerprint


def test_the_hash_repeats_and_follows_every_number_of_the_step():
    torch.set_num_threads(1)
    softmax = fingerprint(["attention=softmax"], 24)
    assert fingerprint(["attention=softmax"], 24) == softmax
    assert fingerprint(["attention=softmax", "model.dropout=0.2"], 24) != softmax  # dropout masks: training mode
    assert fingerprint(["attention=curformer", "attention.num_landmarks=8"], 24) != softmax
    assert fingerprint(["attention=softmax"], 25) != softmax
