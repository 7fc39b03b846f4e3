"""The tools around the pipeline, above it (they import the compiler; it imports none of
them): `explain` (and its HTML `report`), `check` (is a generated module current?) and
`ops_table` (docs/OPS.md, from the registry). The pipeline's own printers (`--dump-after`,
sx2torch/dump.py) and warnings (sx2torch/lint.py) are its part."""
