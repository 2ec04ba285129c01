"""Small pure helpers shared by the algorithm files in `algos/`.

Nothing here knows about a config object: every function takes arrays and scalars.
"""
