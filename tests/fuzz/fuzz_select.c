/* Small input surfaces of issue 26: device selectors (--devices, CLGRAD_DEVICES), batch split weights
 * (--split, clg_model_params.split) and option values (CLGRAD_* numbers and texts). The first byte picks
 * the surface (and the device count or option), the rest is the text. */
#include <math.h>

#include "core/options.h"
#include "device/device.h"
#include "fuzz_util.h"
#include "parallel/dp.h"

static void selector(const char *text, int count)
{
    clg_device_info infos[4];
    memset(infos, 0, sizeof infos);
    static const char *const names[] = {"pthread-cpu", "basic", "Fake GPU", "accel"};
    for (int i = 0; i < 4; i++) {
        snprintf(infos[i].name, sizeof infos[i].name, "%s", names[i]);
        snprintf(infos[i].vendor, sizeof infos[i].vendor, "vendor%d", i);
        infos[i].type = i == 2 ? CLG_DEVICE_GPU : i == 3 ? CLG_DEVICE_ACCELERATOR : CLG_DEVICE_CPU;
    }
    clg_err err;
    int sel[4], n = -1;
    if (clg_select_devices(&err, text, infos, count, sel, 4, &n) != CLG_OK)
        return;
    if (!*text || n < 1 || n > count) /* an empty selector is refused; a selection is never empty */
        abort();
    for (int i = 0; i < n; i++) {
        if (sel[i] < 0 || sel[i] >= count)
            abort();
        for (int j = 0; j < i; j++)
            if (sel[i] == sel[j])
                abort();
    }
}

static void split(const char *text, int n)
{
    clg_err err;
    double w[4];
    int fixed = -1;
    if (clg_dp_parse_split(&err, text, n, w, &fixed) != CLG_OK)
        return;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(w[i]) || w[i] < 0 || w[i] > 1)
            abort();
        sum += w[i];
    }
    if (fabs(sum - 1) > 1e-9)
        abort();
}

static void option(const char *text, int id)
{
    clg_opts o;
    clg_opts_init(&o);
    clg_err err;
    (void)clg_opts_set_id(&o, id % CLG_OPT_COUNT, text, CLG_OPTION_ENV, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *text = fuzz_text(data + 1, size - 1);
    if (!text)
        return 0;
    int k = data[0] >> 2;
    switch (data[0] & 3) {
    case 0:
        selector(text, k % 5);
        break;
    case 1:
        split(text, 1 + k % 4);
        break;
    default:
        option(text, k);
        break;
    }
    free(text);
    return 0;
}
