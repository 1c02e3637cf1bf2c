"""`zbench estimate` on the shipped Hugging Face shapes counts every weight: DeBERTa and Longformer (encoders, no
causal-LM class) are estimated, and BlenderBot keeps its encoder (its causal-LM class is the decoder alone)."""

from __future__ import annotations

import pytest

from helpers import cli

pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "name,total",
    [
        ("deberta-v2-xlarge", "887M"),  # the article's "DeBERTa-XL (900M)"
        ("longformer-base-4096", "149M"),
        ("blenderbot-400M-distill", "365M"),  # encoder + decoder; the decoder alone is 325M
    ],
)
def test_shipped_hf_models_are_estimated_whole(name, total):
    result = cli("estimate", "--model", name)
    assert result.exit_code == 0, result.output
    assert f"SW: Model with {total} total params" in result.output
