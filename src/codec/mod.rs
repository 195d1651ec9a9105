//! Bit-exact number-format codecs (CPU): the ground truth that kernels and prepasses are tested
//! against.
