"""Quality harness: the paper's experiments in miniature, with the baselines users would pick instead.

One module per experiment, each runnable as ``python -m bench.quality.<experiment>``:

=====================  ==========================================================================
module                 paper table / section
=====================  ==========================================================================
``overlap``            "Label-overlap continuum" (tab:overlap-continuum, tab:frozen-backbone-proxy)
``verbalizer``         "Identifiability Stress Test: Verbalizer Shift" (tab:verbalizer-shift)
``domains``            "Vocabulary-scale transfer prediction" (tab:vocab-scale), in miniature
``routing``            "Training-free task retrieval" (tab:retrieval) + activation-dark diagnostic
``dynamic_addition``   "Dynamic addition" (tab:dynamic-addition)
``smiles``             "Molecular SMILES proof of concept" (tab:smiles-proof)
=====================  ==========================================================================

Shared helpers: :mod:`bench.quality.common` (CLI, model, sketching), :mod:`bench.quality.data`
(dataset builders from ``shared/data``; SuperGLUE and the verbalizer prompts in
:mod:`bench.quality.data_superglue`, the SMILES domains in :mod:`bench.quality.data_smiles`),
:mod:`bench.quality.routing_setup` (experiment 4's tasks, cached index and prompts, as 4b, 4c and 5 reuse them),
:mod:`bench.quality.route_matrices` (the product's route and ranking scores over prompts × tasks),
:mod:`bench.quality.transfer` (head-only transfer oracle and source-selection metrics),
:mod:`bench.quality.embed` (the sentence-embedding router baseline), :mod:`bench.quality.report` (markdown
tables and ``bench/results/quality.md``).
"""
