"""`deepspeed.runtime.activation_checkpointing`: where DeepSpeed keeps `deepspeed.checkpointing`."""
