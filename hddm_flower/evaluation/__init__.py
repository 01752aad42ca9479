"""Evaluating an assembled run and reporting it: every routing mode under aligned inference
(:mod:`~hddm_flower.evaluation.evaluate`), the sample-quality metrics and their feature networks
(:mod:`~hddm_flower.evaluation.metrics`), prompt adherence, the FID/KID reference statistics of the dataset, and
the report and model cards written from the results."""
