"""The host side, used only by the command line: the driver (`cli`, with its checks before
compiling in `preflight`, its shared state and checkpoint queue in `session`, its per-chunk
output in `output` and its stopping in `stopping`), its run options (`options`), devices and
processes (`devices`), checkpoints, progress and TensorBoard (`logger`), GIFs (`video`) and the
opt-in Threefry lowering (`prng`). Nothing here runs inside a compiled `train`, and nothing in
`common/` outside this package imports it.
"""
