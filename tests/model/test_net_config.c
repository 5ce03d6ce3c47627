/* The [net] section (src/model/net_config.c): defaults, every optimizer and
 * schedule name read back as its enum, every training key read into
 * clg_hparams (random values each run), and refusals naming file, line, key
 * and the accepted choices or range. No device needed: clg_net_build only
 * configures device-less layer prototypes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>

#include "io/dataset.h"
#include "model/network.h"
#include "model/optim.h"

/* the model's limit of augment_shift is the dataset's */
_Static_assert(CLG_HP_MAX_SHIFT == CLG_DS_MAX_SHIFT, "CLG_HP_MAX_SHIFT differs from CLG_DS_MAX_SHIFT");

#define HEAD "[net]\nchannels=1\nheight=4\nwidth=4\n"
#define TAIL "[dense]\nunits=3\n[softmax]\n"

static clg_net *build(const char *net_keys)
{
    char text[1024];
    snprintf(text, sizeof text, HEAD "%s" TAIL, net_keys);
    clg_err err = {0};
    clg_net *net = NULL;
    clg_status st = clg_net_build(&err, text, "t.cfg", 0, &net);
    ck_assert_msg(st == CLG_OK, "'%s': %s", net_keys, err.msg);
    return net;
}

/* Building with net_keys fails with a message containing needle. */
static void refused(const char *net_keys, const char *needle)
{
    char text[1024];
    snprintf(text, sizeof text, HEAD "%s" TAIL, net_keys);
    clg_err err = {0};
    clg_net *net = NULL;
    clg_status st = clg_net_build(&err, text, "t.cfg", 0, &net);
    ck_assert_msg(st == CLG_ERR_FORMAT, "'%s' accepted (status %d)", net_keys, (int)st);
    ck_assert_ptr_null(net);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "'%s': message '%s' lacks '%s'", net_keys, err.msg, needle);
}

START_TEST(defaults)
{
    clg_hparams d;
    clg_hparams_defaults(&d);
    clg_net *net = build("");
    const clg_hparams *h = &net->hp;
    ck_assert_int_eq(net->batch, 64);
    ck_assert_int_eq(net->classes, 3);
    ck_assert(h->learning_rate == d.learning_rate && d.learning_rate == 0.01);
    ck_assert(h->momentum == d.momentum && h->weight_decay == 0 && h->nesterov == 0);
    ck_assert_int_eq(h->optimizer, CLG_OPT_SGD);
    ck_assert(h->beta1 == 0.9 && h->beta2 == 0.999 && h->epsilon == 1e-8);
    ck_assert_int_eq(h->schedule, CLG_SCHED_NONE);
    ck_assert(h->step_size == 1 && h->gamma == 0.1 && h->warmup == 0 && h->epochs == 10 && h->clip_norm == 0);
    ck_assert(h->augment_flip == 0 && h->augment_shift == 0);
    clg_net_free(net);
}
END_TEST

/* Every name the optimizer module knows maps to its enum, in both tables. */
START_TEST(names)
{
    int nopt = 0, nsched = 0;
    for (int i = 0; strcmp(clg_optim_name(i), "?") != 0; i++, nopt++) {
        char keys[64];
        snprintf(keys, sizeof keys, "optimizer = %s\n", clg_optim_name(i));
        clg_net *net = build(keys);
        ck_assert_int_eq(net->hp.optimizer, i);
        ck_assert_int_eq(clg_optim_parse(clg_optim_name(i)), i);
        clg_net_free(net);
    }
    for (int i = 0; strcmp(clg_sched_name(i), "?") != 0; i++, nsched++) {
        char keys[64];
        snprintf(keys, sizeof keys, "schedule = %s\n", clg_sched_name(i));
        clg_net *net = build(keys);
        ck_assert_int_eq(net->hp.schedule, i);
        clg_net_free(net);
    }
    ck_assert_int_eq(nopt, 3);
    ck_assert_int_eq(nsched, 3);
    ck_assert_int_eq(clg_optim_parse("adamw"), CLG_OPT_ADAMW);
    ck_assert_int_eq(clg_sched_parse("cosine"), CLG_SCHED_COSINE);
}
END_TEST

static double urand(double lo, double hi) { return lo + (hi - lo) * (rand() / (double)RAND_MAX); }

/* Every training key is read into its field (fresh random values). */
START_TEST(values)
{
    for (int round = 0; round < 20; round++) {
        double lr = urand(1e-4, 1), mom = urand(0, 0.99), wd = urand(0, 0.1), b1 = urand(0, 0.99),
               b2 = urand(0.9, 0.9999), eps = urand(1e-9, 1e-3), ss = urand(0.5, 20), gam = urand(0, 1),
               clip = urand(0, 10);
        int nest = rand() % 2, flip = rand() % 2, shift = rand() % (CLG_HP_MAX_SHIFT + 1), epochs = 1 + rand() % 500,
            batch = 1 + rand() % 300, opt = rand() % 3, sched = rand() % 3;
        long warm = rand() % 100000;
        char keys[900];
        snprintf(keys, sizeof keys,
                 "batch = %d\nlearning_rate = %.17g\nmomentum = %.17g\nnesterov = %d\nweight_decay = %.17g\n"
                 "optimizer = %s\nbeta1 = %.17g\nbeta2 = %.17g\nepsilon = %.17g\nschedule = %s\nstep_size = %.17g\n"
                 "gamma = %.17g\nwarmup = %ld\nepochs = %d\nclip_norm = %.17g\naugment_flip = %d\naugment_shift = %d\n",
                 batch, lr, mom, nest, wd, clg_optim_name(opt), b1, b2, eps, clg_sched_name(sched), ss, gam, warm,
                 epochs, clip, flip, shift);
        clg_net *net = build(keys);
        const clg_hparams *h = &net->hp;
        ck_assert_int_eq(net->batch, batch);
        ck_assert(h->learning_rate == lr && h->momentum == mom && h->weight_decay == wd);
        ck_assert(h->beta1 == b1 && h->beta2 == b2 && h->epsilon == eps);
        ck_assert(h->step_size == ss && h->gamma == gam && h->clip_norm == clip);
        ck_assert_int_eq(h->nesterov, nest);
        ck_assert_int_eq(h->optimizer, opt);
        ck_assert_int_eq(h->schedule, sched);
        ck_assert_int_eq(h->warmup, warm);
        ck_assert_int_eq(h->epochs, epochs);
        ck_assert_int_eq(h->augment_flip, flip);
        ck_assert_int_eq(h->augment_shift, shift);
        clg_net_free(net);
    }
}
END_TEST

START_TEST(refusals)
{
    refused("optimizer = sgdd\n", "t.cfg:5: [net] key 'optimizer': 'sgdd' is not one of: sgd, adam, adamw");
    refused("schedule = linear\n", "t.cfg:5: [net] key 'schedule': 'linear' is not one of: none, step, cosine");
    char keys[64];
    snprintf(keys, sizeof keys, "augment_shift = %d\n", CLG_HP_MAX_SHIFT + 1);
    refused(keys, "t.cfg:5: [net] key 'augment_shift'");
    refused("augment_flip = 2\n", "t.cfg:5: [net] key 'augment_flip'");
    refused("momentum = 1\n", "key 'momentum'");
    refused("epochs = 0\n", "key 'epochs'");
    refused("learning_rate = -1\n", "key 'learning_rate'");
    refused("colour = 1\n", "colour");
}
END_TEST

/* A layer name that reads as a number would be ambiguous with `input = N` (an index): refused, naming
 * file, line and key (issue 26 item 3). Ordinary names, including ones with digits, still build. */
START_TEST(numeric_names)
{
    const char *bad[] = {"-1", "3", "0", "+2", "007", "-0", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[512], needle[128];
        snprintf(text, sizeof text, HEAD "[dense]\nunits=4\nname = %s\n[dense]\nunits=3\n[softmax]\n", bad[i]);
        snprintf(needle, sizeof needle, "t.cfg:7: [dense] key 'name': '%s'", bad[i]);
        clg_err err = {0};
        clg_net *net = NULL;
        clg_status st = clg_net_build(&err, text, "t.cfg", 0, &net);
        ck_assert_msg(st == CLG_ERR_FORMAT, "name '%s' accepted (status %d)", bad[i], (int)st);
        ck_assert_ptr_null(net);
        ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
        ck_assert_msg(strstr(err.msg, "number") != NULL, "message '%s' does not say why", err.msg);
    }
    clg_err err = {0};
    clg_net *net = NULL;
    clg_status st = clg_net_build(&err, HEAD "[dense]\nunits=4\nname = fc1\n[dense]\nunits=4\nname = 1e3\n"
                                           "[dense]\nunits=3\ninput = 1e3\nname = x-1\n[softmax]\n",
                                  "t.cfg", 0, &net);
    ck_assert_msg(st == CLG_OK, "%s", err.msg);
    clg_net_free(net);
}
END_TEST

int main(void)
{
    srand((unsigned)time(NULL));
    Suite *s = suite_create("net_config");
    TCase *tc = tcase_create("net_config");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, names);
    tcase_add_test(tc, values);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, numeric_names);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
