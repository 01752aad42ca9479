"""The configuration: the schema (:mod:`~hddm_flower.config.schema`: :class:`Config` and the checks that span
sections), its sections (:mod:`~hddm_flower.config.sections`), the per-key checks they are written in
(:mod:`~hddm_flower.config.rules`), and reading YAML files and dotted overrides into it
(:mod:`~hddm_flower.config.io`). Torch-free: the command line and the Flower apps read it without the tensor code.
"""
