# Stand-in for the third-party package `einops` (not packaged in Debian 12, no PyPI access here).
# msprobe imports `einops.rearrange` only in pytorch/bench_functions/npu_fusion_attention.py
# (a CPU benchmark of an Ascend-NPU fused kernel), which msprobe's package __init__ imports
# eagerly. The dump path used by make_reference.py never calls it, so it only has to exist.
def rearrange(*args, **kwargs):
    raise NotImplementedError("einops stand-in (msprobe_shims): rearrange is not available")
