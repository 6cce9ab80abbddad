"""Generation over any Decoder: sampling, streaming generation, speculative decoding, grammars,
tool calls, embeddings, and the fingerprints that prove two runs computed the same bits."""
