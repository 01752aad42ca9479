"""The framework-free half of the federated parts of a run: what a node computes on its own data for the router
and the evaluation (:mod:`~hddm_flower.federation.local`), and institution-owned data's declarations and the
data-free description of the run the coordinator works from (:mod:`~hddm_flower.federation.declarations`). The
Flower adapters are ``clients/round_handlers.py``, ``clients/declare.py``, ``strategies/router_rounds.py`` and
``strategies/gather_declarations.py``."""
