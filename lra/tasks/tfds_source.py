"""Reading a prepared TensorFlow Datasets dataset without TensorFlow (``tfds.data_source``).

``tensorflow-datasets`` is optional (``requirements-data.txt``): it is imported only when a task's
``source`` asks for TFDS. Datasets must have been prepared in the ``array_record`` file format,
which is what ``python -m lra.data download --tfds`` does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any


def tfds_available() -> bool:
    """True when ``tensorflow_datasets`` can be imported."""
    return importlib.util.find_spec("tensorflow_datasets") is not None


def load_tfds(name: str, split: str, data_dir: str | None) -> Sequence[dict[str, Any]]:
    """Random-access examples of TFDS ``name`` / ``split`` (dicts of numpy values) from ``data_dir``."""
    if not tfds_available():
        raise ImportError(
            f"the TFDS source of '{name}' needs tensorflow-datasets: '.venv/bin/pip install -r requirements-data.txt', "
            "or use the raw-archive source (see data/README.md)"
        )
    import tensorflow_datasets as tfds

    try:
        return tfds.data_source(
            name, split=split, data_dir=data_dir, download=False, builder_kwargs={"file_format": "array_record"}
        )
    except (KeyError, FileNotFoundError, AssertionError) as error:
        where = data_dir or "the TFDS default directory (~/tensorflow_datasets or $TFDS_DATA_DIR)"
        raise FileNotFoundError(
            f"TFDS dataset '{name}' split '{split}' is not prepared in {where} ({error}); run "
            f"'python -m lra.data download --tfds {name}' (prepares it in the array_record format) "
            "or set the task's tfds_data_dir to where it is prepared"
        ) from error


def tfds_prepared(name: str, data_dir: str | None) -> bool:
    """True when TFDS is installed and ``name`` is prepared (array_record) in ``data_dir``."""
    if not tfds_available():
        return False
    import tensorflow_datasets as tfds

    return tfds.builder(name, data_dir=data_dir, file_format="array_record").is_prepared()
