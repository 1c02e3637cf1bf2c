"""Model definitions (no parallelism in here: the engines wrap any nn.Module)."""
