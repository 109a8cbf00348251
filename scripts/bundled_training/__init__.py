"""Training of the bundled default causal LM, one module per stage (``scripts/train_bundled_model.py`` runs it).

Modules, imports pointing down this list only:

* :mod:`.training_run` -- one run from the parsed command line to the saved model and summary;
* :mod:`.checkpoint` -- resumable checkpoints (model, optimiser, sampler and RNG states);
* :mod:`.export` -- the ``save_pretrained`` output directory;
* :mod:`.training` -- batch sampler, optimiser, learning-rate schedule, one step, step timing;
* :mod:`.evaluation` -- evaluation windows and the mean next-token loss;
* :mod:`.model` -- the GPT-2 configuration and the bf16 autocast context;
* :mod:`.corpus` -- the tokenised train/held-out/validation streams and their ``.npz`` file;
* :mod:`.tokenizer` -- training or loading the byte-level BPE;
* :mod:`.sources` -- the source rows, their hash bucket and the split;
* :mod:`.constants` -- special token, sizes, buckets and domains.
"""
