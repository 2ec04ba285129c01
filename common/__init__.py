"""Pure, jittable pieces the algorithm files in `algos/` share (advantages, rollout, layers,
collectives, normalisation, minibatches, config checks, evaluation). Nothing here knows about
a config object: every function takes arrays and scalars. The command line's host side lives
in `common/host/`.
"""
