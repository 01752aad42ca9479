"""``hddm reproduce``: the paper's comparison tables in one command (:mod:`~hddm_flower.reproduce.run`), from what
it trains and reuses (:mod:`~hddm_flower.reproduce.training`), laid out beside the paper's numbers
(:mod:`~hddm_flower.reproduce.tables`)."""
