"""LRA Retrieval (AAN pairs): TSV reader, errors, the pair head and the shared encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from lra.build import attention_factory
from lra.tasks.retrieval import RetrievalDataModule
from models.encoder import Encoder
from models.heads import PairHead
from tests.conftest import compose_config

ROWS = {
    "train": [("1.0", "P1", "P2", "Graph parsing \u00e9t\u00e9.", "We parse graphs " * 5),
              ("0.0", "P3", "P4", "Machine translation", "Speech"),
              ("1.0", "P5", "P6", "A" * 70, "b")],
    "eval": [("0.0", "P7", "P8", "Tagging", "Chunking \u2014 fast"), ("1", "P9", "P1", "x", "y z")],
    "test": [("1.0", "P2", "P3", "Lexicon", "Dictionary"), ("0.0", "P4", "P5", "Sentiment", "Syntax")],
}


def write_aan(root: Path) -> Path:
    """``new_aan_pairs.{train,eval,test}.tsv`` at ``root``: no header, tabs, ``label id1 id2 text1 text2``."""
    root.mkdir(parents=True, exist_ok=True)
    for split, rows in ROWS.items():
        lines = ["\t".join(row) for row in rows]
        (root / f"new_aan_pairs.{split}.tsv").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return root


@pytest.fixture(scope="module")
def aan(tmp_path_factory) -> Path:
    return write_aan(tmp_path_factory.mktemp("data") / "tsv_data")


def module(root: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_dir=str(root), max_length=40, batch_size=2, cache_dir=None)


@pytest.mark.parametrize(("split", "file"), [("train", "train"), ("val", "eval"), ("test", "test")])
def test_reader_gives_both_documents_as_bytes_and_integer_labels(aan, split, file):
    data = module(aan).load_split(split)
    rows = ROWS[file]
    assert data.ids.shape == (len(rows), 2, 40) and data.lengths.shape == (len(rows), 2)
    for i, row in enumerate(rows):
        assert int(data.labels[i]) == int(float(row[0]))
        for j, text in enumerate(row[3:]):
            ids = [b + 1 for b in text.encode("utf-8")[:40]]
            assert data.ids[i, j, : len(ids)].tolist() == ids
            assert data.ids[i, j, len(ids):].eq(0).all() and int(data.lengths[i, j]) == len(ids)


def test_a_line_with_the_wrong_column_count_names_file_and_line(tmp_path):
    root = write_aan(tmp_path / "tsv")
    path = root / "new_aan_pairs.eval.tsv"
    path.write_text(path.read_text() + "1.0\tP1\tonly three\n")
    with pytest.raises(ValueError, match=rf"{path}:3: expected 5 tab-separated columns .* found 3"):
        module(root).load_split("val")


def test_a_bad_label_names_file_and_line(tmp_path):
    root = write_aan(tmp_path / "tsv")
    path = root / "new_aan_pairs.test.tsv"
    path.write_text("yes\tP1\tP2\ta\tb\n")
    with pytest.raises(ValueError, match=rf"{path}:1: the label column must be 0 or 1"):
        module(root).load_split("test")


def test_missing_data_names_the_download_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"new_aan_pairs.train.tsv.*python -m lra.data download lra_release"):
        module(tmp_path).load_split("train")


def test_pair_head_classifies_a_b_product_and_difference():
    torch.manual_seed(0)
    head = PairHead(d_model=4, num_classes=2, hidden_dim=8)
    features = torch.randn(3, 2, 4)
    a, b = features[:, 0], features[:, 1]
    first, second = head.net[0], head.net[2]
    joint = torch.cat([a, b, a * b, a - b], dim=1)
    reference = F.linear(F.relu(F.linear(joint, first.weight, first.bias)), second.weight, second.bias)
    torch.testing.assert_close(head(features), reference)
    assert not torch.allclose(head(features.flip(1)), reference)  # order matters (a - b)
    with pytest.raises(ValueError, match="task=retrieval"):
        head(torch.randn(3, 4))


def test_one_shared_encoder_encodes_both_documents():
    cfg = compose_config(["task=retrieval"])
    torch.manual_seed(0)
    model = Encoder(vocab_size=257, max_length=16, num_classes=2, attention=attention_factory(cfg.attention),
                    block=instantiate(cfg.model.block),
                    head=PairHead, d_model=8, num_heads=2, num_layers=1, ffn_dim=16).eval()
    ids = torch.randint(1, 257, (2, 2, 16))
    mask = torch.arange(16) < torch.tensor([[16, 5], [9, 12]]).unsqueeze(-1)
    logits, _ = model(ids, mask)
    with torch.no_grad():
        features = torch.stack([model.encode(ids[:, j], mask[:, j], {}) for j in range(2)], dim=1)
    torch.testing.assert_close(logits, model.head(features))
