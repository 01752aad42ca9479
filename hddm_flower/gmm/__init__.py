"""The Gaussian-mixture dataset (``data.name: gmm``), whose density is known in closed form, and what is scored
against it: the mixture (:mod:`~hddm_flower.gmm.mixture`), the dataset drawn from it
(:mod:`~hddm_flower.gmm.dataset`), its exact experts and router (:mod:`~hddm_flower.gmm.exact`), the truth metrics
and their targets, and the rows and paired comparisons ``hddm reproduce`` scores on it."""
