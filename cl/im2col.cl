// im2col kernels (placeholder until the op family lands)
