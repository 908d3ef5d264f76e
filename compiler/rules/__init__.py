"""Rule sets of the optimisation pipeline, grouped by purpose (docs/architecture.md, "Optimisation levels").

The pipeline (:mod:`compiler.pipeline`) reads these lists; a rule is a :class:`compiler.rewrite.Rule`
subclass (see docs/writing-a-fusion-rule.md). Add a rule by appending its class to the list of
its purpose, in the order it should be tried:

- ``QUANTIZE_RULES`` (O2+, first, before constant folding): QDQ and dynamically quantized
  products into integer kernels (compiler/rules/quantize.py).
- ``FOLD_RULES`` (O2+): folding that needs patterns, e.g. BatchNormalization into Conv/Gemm.
- ``FUSE_RULES`` (O2+): the fusion catalogue (Conv+bias+activation, LayerNorm, attention ...).
- ``O3_RULES`` (O3 only): numerics-changing rewrites a user opts into; each says by how much.

The simplification rules of O1 live in :mod:`compiler.passes.simplify` (``SIMPLIFY_RULES``).
"""
from __future__ import annotations

from tensorfuse.compiler.rules import (conv_patchify, conv_subsample, fold_batchnorm, fold_pad, fuse_attention,
                                      fuse_conv, fuse_gelu, fuse_layernorm, fuse_matmul, quantize)

QUANTIZE_RULES: list = [*quantize.RULES]
# a strided 1x1 Conv becomes a Slice and a stride-1 Conv here, before the fuse pass, whose
# Conv anchors then take the new Conv's epilogue (a node a rewrite makes is not revisited in
# the pass that made it)
FOLD_RULES: list = [*fold_batchnorm.RULES, *fold_pad.RULES, *quantize.FOLD, *conv_subsample.RULES]
# GELU and LayerNorm are recognised before the anchors take activations; EmbedLayerNorm is tried
# before SkipLayerNorm on the same LayerNormalization (fuse_layernorm.RULES keeps that order); a
# patch-embedding Conv becomes a MatMul before the Conv anchors could take it
FUSE_RULES: list = [*conv_patchify.RULES, *fuse_gelu.RULES, *fuse_layernorm.RULES, *fuse_attention.RULES,
                    *fuse_conv.RULES, *fuse_matmul.RULES]
O3_RULES: list = [*fuse_gelu.O3]
