"""The tools around the pipeline, apart from its passes: `explain` (and its HTML `report`),
`dump` (`--dump-after`) and `check` (is a generated module current?)."""
