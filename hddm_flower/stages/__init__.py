"""The stages of a run, framework-free: the Flower apps and the ``hddm`` command line both call these.

prepare the data (:mod:`.prepare`) → train one expert per client (:mod:`.expert`) → [server] train the router
(:mod:`.router`) → assemble, evaluate and sample the ensemble (:mod:`.assemble`, :mod:`.diagnostics`) → the run directory (:mod:`hddm_flower.rundir`) and its report (:mod:`hddm_flower.evaluation.report`).
A late expert joins an assembled run through :mod:`.add_expert`. The conventions they share (time direction,
velocity, the run directory's layout) are in docs/design.md.
"""
