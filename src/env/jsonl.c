/* jsonl environment (placeholder until implemented): creation fails with LH_ERR_UNSUPPORTED.
 * Kept so the environment table links. */
#include "env_impl.h"

static lh_err t_(lh_env *env, lh_split split, uint64_t index, lh_env_task *task) {
  return lh_errorf(LH_ERR_UNSUPPORTED, "jsonl: not implemented");
}
static lh_err s_(lh_env *env, const lh_env_task *task, const char *text, size_t len,
                 lh_env_result *out) {
  return lh_errorf(LH_ERR_UNSUPPORTED, "jsonl: not implemented");
}
static uint64_t z_(const lh_env *env, lh_split split) {
  return 0;
}
static void f_(lh_env *env) {}
const lh__env_ops lh__env_jsonl_ops = {t_, s_, z_, f_};
lh_err lh__env_jsonl_init(lh_env *env) {
  return lh_errorf(LH_ERR_UNSUPPORTED, "jsonl: not implemented");
}
