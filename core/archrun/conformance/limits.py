"""The tiny fixtures' shared sizes and tolerance (``archrun.conformance.hf`` builds and checks the fixtures;
``archrun.conformance.chains`` compares greedy chains on them): a leaf module both import."""

N_TOKENS = 40  # tokens per fixture
TOLERANCE = 1e-4  # archrun vs HF: max |Δlogit| relative to max |logit|
