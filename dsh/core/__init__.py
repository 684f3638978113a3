"""The bottom layer, imported by every other: one-line argument checks (:mod:`~dsh.core.validate`), atomic writes
and JSON lines (:mod:`~dsh.core.files`), where a result came from (:mod:`~dsh.core.provenance`) and the paper's own
printed numbers (:mod:`~dsh.core.paper`, ``paper_results.yaml``). Imports nothing else of dsh."""
