"""Drop-in paths for training frameworks: Hugging Face Trainer (`transformers.py`), Accelerate
(`accelerate.py`) and Lightning (`lightning.py`). Each module imports its framework on import; this package
imports none of them."""
