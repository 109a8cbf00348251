"""Bundled default model of FisherAtlas (a ``save_pretrained`` directory; see MODEL_CARD.md).

This file only makes the directory a package, so that ``pip install`` ships its ``*.json``,
``*.safetensors`` and ``*.md`` files as package data.
"""
