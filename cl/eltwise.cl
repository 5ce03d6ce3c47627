// eltwise kernels (placeholder until the op family lands)
