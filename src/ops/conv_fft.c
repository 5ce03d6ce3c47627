/* FFT convolution through clFFT (forward). Not implemented yet: reported
 * as unavailable so no caller selects it. */
#include "clg_config.h"
#include "conv_impl.h"

int clg_conv_fft_available(void) { return 0; }

clg_status clg_conv_fft_fwd(clg_device *dev, const clg_conv_shape *s, cl_mem x, size_t offx, cl_mem w, size_t offw,
                            cl_mem bias, size_t offb, int relu, cl_mem y, size_t offy)
{
    return clg_err_set(clg_dev_err(dev), CLG_ERR_UNSUPPORTED, "conv: the FFT algorithm is not available in this build");
}
