#include "testutil.h"
START_TEST(placeholder) { ck_assert_int_eq(1, 1); }
END_TEST
int main(void)
{
    Suite *s = suite_create("program");
    TCase *tc = tcase_create("program");
    tcase_add_test(tc, placeholder);
    suite_add_tcase(s, tc);
    return tu_run(s);
}
