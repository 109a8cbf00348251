"""FisherAtlas as a library: the same store, index and model in your process, no server.

>>> from fisher_atlas import Atlas
>>> atlas = Atlas("./fisher-atlas-data")            # doctest: +SKIP
>>> atlas.add("smiles", ["CCO", "CC(=O)O"])          # doctest: +SKIP

:class:`Atlas` builds the service's composition root (:class:`service.container.Container`) over a data
directory and calls the same services the HTTP routes call, so a server started later on the same
directory gives the same answers.
"""

from fisher_atlas.library import Atlas, AtlasClosed

__all__ = ["Atlas", "AtlasClosed"]
