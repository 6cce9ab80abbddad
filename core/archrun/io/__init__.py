"""Reading model files: validated GGUF (single and split), dequantization, weights, adapters, streamed experts."""
