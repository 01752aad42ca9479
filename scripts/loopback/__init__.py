"""The pieces of the loopback deployment that ``scripts/deploy_loopback.py`` runs: the harness
(:mod:`loopback.harness`) and the story with its drills (:mod:`loopback.drills`)."""
