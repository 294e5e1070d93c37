"""One module per LRA task: data format reader (and generator when synthetic), Dataset, DataModule."""
