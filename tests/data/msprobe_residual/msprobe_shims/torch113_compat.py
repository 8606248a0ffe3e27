"""Minimal torch 1.13 compatibility patches for running msprobe 26.0 (Ascend/msprobe) from source.

Import this module before anything from msprobe. It patches only what msprobe's PyTorch dump path
(PrecisionDebugger, task statistics, levels L0/mix) needs and torch 1.13 does not have; everything
that exists is left alone.

Found by running msprobe @ 8ff00da on Debian 12's python3-torch 1.13.1:

* torch._C._autograd.{CreationMeta, _get_creation_meta, _set_creation_meta} -- Python bindings added
  in torch 2.x. msprobe's module backward hooks (pytorch/dump/module_dump/hook_wrapper.py,
  wrap_setup_backward_hook.rebuild_args) wrap a module's input/output tensors with
  torch.utils.hooks.BackwardHook; the wrapped tensors are views created in a custom Function
  (BackwardHookFunction), and msprobe resets their creation meta to DEFAULT so that in-place ops on
  them are allowed. Without the bindings rebuild_args raises AttributeError, which msprobe catches
  and silently falls back to the *unwrapped* tensors: no module backward hook ever fires and the dump
  has no Module.*.backward.N entries at all.
  torch 1.13 cannot read or change a tensor's creation meta from Python, so the stand-in reports
  DEFAULT (msprobe then leaves the view as it is). Consequence: an in-place op on a module's input or
  output under msprobe's module hooks still fails on torch 1.13 ("... is a view and is being modified
  inplace ... created inside a custom Function ..."), exactly as it does without msprobe's reset;
  models dumped with this shim must use out-of-place ops there (e.g. nn.ReLU(inplace=False)).
  The enum values mirror the CreationMeta enum order in torch/csrc/autograd/variable.h (1.13).
"""
import enum

import torch

_autograd = torch._C._autograd

if not hasattr(_autograd, "CreationMeta"):
    class CreationMeta(enum.IntEnum):
        DEFAULT = 0
        IN_CUSTOM_FUNCTION = 1
        MULTI_OUTPUT_NODE = 2
        NO_GRAD_MODE = 3
        INFERENCE_MODE = 4

    _autograd.CreationMeta = CreationMeta

if not hasattr(_autograd, "_get_creation_meta"):
    def _get_creation_meta(tensor):
        # not observable from Python on torch 1.13; see the module docstring
        return _autograd.CreationMeta.DEFAULT

    _autograd._get_creation_meta = _get_creation_meta

if not hasattr(_autograd, "_set_creation_meta"):
    def _set_creation_meta(tensor, creation_meta):
        # never reached (the getter above always says DEFAULT); nothing to do on torch 1.13
        pass

    _autograd._set_creation_meta = _set_creation_meta
