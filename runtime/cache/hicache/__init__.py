"""Hierarchical KV cache (HiCache): the radix cache over device, host and storage tiers.

``options.py`` validates the engine options (no torch import: the config imports it),
``factory.py`` builds the tree for a scheduler, ``tree.py`` is the tiered radix cache,
``transfer.py`` the device<->host copies, ``storage.py`` the file tier and ``pages.py`` the
glue between tree nodes and stored pages.
"""
