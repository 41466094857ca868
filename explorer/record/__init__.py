"""Recording: `deferred_init` runs a constructor with fake tensors and writes every op into a graph.

No imports here on purpose: `replay/` imports `record.fake` and `record.generators`, and
`record.deferred` imports `replay/`; an eager package import would close that loop at run time.
"""
