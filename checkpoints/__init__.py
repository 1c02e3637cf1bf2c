"""checkpoints: the universal checkpoint format and its converters (imports only torch and safetensors)."""
