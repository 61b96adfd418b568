"""Hugging Face model folders as fedshard tasks: LoRA fine-tuning, adapters out in PEFT's format.

* :mod:`~fedshard.tasks.hf.task`: ``task.target: fedshard.tasks.hf:sequence_classification``;
* :mod:`~fedshard.tasks.hf.folder`: the model folder, checked whole and offline;
* :mod:`~fedshard.tasks.hf.table`: the labelled text table (CSV or JSON Lines);
* :mod:`~fedshard.tasks.hf.model`: the frozen model under LoRA adapters and a new head;
* :mod:`~fedshard.tasks.hf.training`: tokenising, training and scoring;
* :mod:`~fedshard.tasks.hf.adapter`: a site's federated adapters written as a PEFT adapter folder.
"""

from __future__ import annotations

from fedshard.tasks.hf.task import SequenceClassification, sequence_classification

__all__ = ["SequenceClassification", "sequence_classification"]
