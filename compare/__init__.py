"""The comparator, in stages that import one way (docs/design.md, Architecture): `plan`, `launch`, `measure`,
`analysis`, `report`, each a package; `common` beneath them all; the command line (`cli`, `terminal`) and
the run from start to report (`runner`) above them."""
