"""The bounds of user input as plain numbers (no imports): the command line reads them without loading pydantic,
zero_core or torch; `limits.py` builds the checked types on them."""

MAX_BATCH = 65_536  # rows per GPU (batch sizes, batch search)
MAX_SEQ = 1 << 20  # tokens per row (seq_len, target_len, positions)
MAX_STEPS = 10_000_000  # optimizer steps (steps, warmup, checkpoint_every, timing_skip_steps)
MAX_EPOCHS = 10_000
MAX_GRAD_ACCUM = 65_536
MAX_RANKS = 1024  # ranks per node (gpus, --gpus, --simulate-ranks)
MAX_NODES = 100_000
MAX_SAMPLES = 1_000_000_000  # rows of a data set
MAX_LABELS = 1_000_000
MAX_SEED = 2**32 - 1  # derived seeds (seed * 100_003 + pass, seed + rank) stay in torch.manual_seed's 64 bits
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # one week: a collective timeout beyond that is no timeout
