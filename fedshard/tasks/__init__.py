"""Tasks fedshard provides, for a user's own model and data (``task.target`` names them).

* :mod:`fedshard.tasks.hf`: a Hugging Face model folder fine-tuned with LoRA adapters
  (``fedshard.tasks.hf:sequence_classification``); its adapters export in PEFT's format.
* :mod:`fedshard.tasks.tabular`: an outcome predicted from a table of records
  (``fedshard.tasks.tabular:classification``): logistic regression or an MLP, DP-SGD ready.
* :mod:`fedshard.tasks.partition`: how a simulated federation cuts one data set among its sites;
* :mod:`fedshard.tasks.files`: where a task's files are (``package:NAME/PATH`` for a wheel's), table rows;
* :mod:`fedshard.tasks.loop`: the training and scoring loops the tasks share.

Tasks are loaded by name (:func:`fedshard.task.load_task`): nothing in fedshard imports them.
"""
