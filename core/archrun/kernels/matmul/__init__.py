"""The quantized-matmul engine: GGUF blocks repacked into lane-interleaved layouts, integer dots (decode),
int8 GEMMs (prefill), dequantization, 16-bit float products, SIMD intrinsics and the thread runtime."""
