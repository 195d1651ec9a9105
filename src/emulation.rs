//! CPU emulations of the quantized and 16-bit modes.
