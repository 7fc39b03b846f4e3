"""The tools around the pipeline, apart from its passes: `explain` (and its HTML `report`),
`dump` (`--dump-after`), `lint` (the warnings a compile prints), `check` (is a generated
module current?) and `ops_table` (docs/OPS.md, from the registry)."""
