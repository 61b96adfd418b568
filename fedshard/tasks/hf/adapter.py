"""A site's federated adapters written as a PEFT adapter folder.

``fedshard export adapter`` builds the model a site holds (the task's model, its trained
tensors read from the site's sealed store) and writes what ``PeftModel.save_pretrained``
writes: ``adapter_config.json`` (rank, alpha, target modules, the head as a module to save,
the base model's folder) and ``adapter_model.safetensors`` (the LoRA matrices and the head).
Anyone with the same base folder loads it the usual way::

    base = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3)
    model = PeftModel.from_pretrained(base, adapter_dir)

and gets the federated model's outputs: the adapters and the head are the federation's values
bit for bit, the base is the folder's. (A site that streamed an int8-sealed base,
``store.base: int8``, trained and scored on that base; on the folder's fp32 base the same
adapters score within the quantisation error, not bit for bit.)

The folder is written beside its destination and renamed into place: an existing,
non-empty destination is refused, never overwritten.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.errors import TaskError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ADAPTER_FILES", "write_adapter"]

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""What a PEFT adapter folder holds (what :func:`write_adapter` writes, with a README)."""


def write_adapter(model: nn.Module, out: Path) -> list[Path]:
    """Write ``model``'s adapters (a ``peft.PeftModel``) into the new folder ``out``; its files.

    Raises
    ------
    TaskError
        The model has no PEFT adapters, or ``out`` exists and is not empty.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TaskError(
            f"the federation's model is a {type(model).__name__}, not a PEFT model: only a task that trains "
            "adapters (fedshard.tasks.hf) exports them"
        )
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TaskError(f"{out} exists and is not empty; choose a new folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(str(staging))
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p for p in out.iterdir() if p.is_file())
