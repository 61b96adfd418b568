"""Tasks fedshard provides, for a user's own model and data (``task.target`` names them).

* :mod:`fedshard.tasks.hf`: a Hugging Face model folder fine-tuned with LoRA adapters
  (``fedshard.tasks.hf:sequence_classification``); its adapters export in PEFT's format.
* :mod:`fedshard.tasks.partition`: how a simulated federation cuts one data set among its sites.

Tasks are loaded by name (:func:`fedshard.task.load_task`): nothing in fedshard imports them.
"""
