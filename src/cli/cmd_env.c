/* `longhaul env SUBCOMMAND`: looking at environments before a run. `env show SPEC` prints the
 * environment's prompt format, its effective settings (defaults filled in, with each key's range)
 * and its first tasks of a split with their prompts, answers, reference solutions and difficulty
 * levels. A bad spec is a usage error (exit code 2), as a bad flag is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longhaul/env.h"

#define SHOW_CMD  "env show"
#define TEXT_SHOW 4096 /* bytes of a prompt or answer shown, escaped, before "..." */

static const lh__flag show_flags[] = {
    {"n", "N", false, "tasks to show, from index 0 (default 3; 0: settings only)"},
    {"split", "train|test", false, "the split the tasks come from (default train)"},
};

static const char *const splits[] = {"train", "test", NULL};

/* Prints `label` and text as one line, escaped: a prompt's newlines show as \n, and bytes from a
 * file or a program cannot drive the terminal. */
static void print_text(const char *label, const char *text) {
  static char buf[TEXT_SHOW];
  printf("  %-9s \"%s\"\n", label, lh_escape(text, strlen(text), buf, sizeof buf));
}

/* SPEC is the one argument that is neither a flag nor a flag's value; the others go to the flag
 * parser, in order, in rest[]. Returns the number of them, or -1 after a usage error. */
static int take_spec(int argc, char **argv, const char **spec, char **rest) {
  int n = 0;
  *spec = NULL;
  rest[n++] = argv[0];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool flag = !strncmp(a, "--", 2) || !strcmp(a, "-h");
    if (flag) {
      rest[n++] = argv[i];
      /* every flag of `env show` takes a value: "--n 5" holds the value in the next argument */
      if (strncmp(a, "--", 2) == 0 && !strchr(a, '=') && strcmp(a, "--help") && i + 1 < argc &&
          strncmp(argv[i + 1], "--", 2) != 0)
        rest[n++] = argv[++i];
    } else if (!*spec) {
      *spec = a;
    } else {
      lh__cli_error(SHOW_CMD, LH__EXIT_USAGE,
                    "unexpected argument \"%s\" after SPEC \"%s\" (see longhaul env show --help)",
                    a, *spec);
      return -1;
    }
  }
  return n;
}

static int env_show(int argc, char **argv) {
  bool help = false;
  for (int i = 1; i < argc; i++)
    help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
  lh__args a = {
      .cmd = help ? SHOW_CMD " SPEC" : SHOW_CMD,
      .about = "Prints an environment's prompt format, its settings with defaults filled in "
               "(each key with\nthe values it takes) and tasks 0..N-1 of a split: prompt, "
               "answer, reference solution and\ndifficulty level. SPEC is NAME or "
               "NAME:key=value,... (arith, countdown, sort, jsonl, exec), as\nsft, rl and eval "
               "take it; an exec program is started to ask it for the tasks. Text is\nshown "
               "escaped (a newline as \\n, control bytes as \\xNN).",
      .flags = show_flags,
      .n_flags = (int)(sizeof show_flags / sizeof show_flags[0])};
  char **rest = malloc(((size_t)argc + 1) * sizeof *rest);
  if (!rest) return lh__cli_error(SHOW_CMD, LH__EXIT_FAIL, "out of memory");
  const char *spec = NULL;
  int n = help ? argc : take_spec(argc, argv, &spec, rest);
  int rc = n < 0 ? LH__EXIT_USAGE : lh__args_parse(&a, n, help ? argv : rest);
  free(rest);
  if (rc != LH__ARGS_CONTINUE) return rc;
  if (!spec)
    return lh__cli_error(SHOW_CMD, LH__EXIT_USAGE,
                         "missing SPEC, the environment to show (NAME or NAME:key=value,...; see "
                         "longhaul env show --help)");
  long count = 0;
  int split = 0;
  if ((rc = lh__args_int(&a, "n", 0, 100000, 3, &count)) != LH__ARGS_CONTINUE) return rc;
  if ((rc = lh__args_choice(&a, "split", splits, 0, &split)) != LH__ARGS_CONTINUE) return rc;

  /* a bad spec is the user's mistake, like a bad flag: exit code 2 */
  lh_env_config cfg;
  lh_env *env = NULL;
  lh_err e = lh_env_config_parse(spec, &cfg);
  if (!e) e = lh_env_create(&cfg, &env);
  if (e == LH_ERR_USAGE) return lh__cli_error(SHOW_CMD, LH__EXIT_USAGE, "%s", lh_last_error());
  if (e) return lh__cli_fail(SHOW_CMD);

  const lh_env_config *c = lh_env_config_of(env);
  static char text[2 * LH_ENV_PATH_MAX + 256], esc[4 * LH_ENV_PATH_MAX];
  printf("environment: %s\n", c->name);
  printf("prompt format: %s\n", lh_env_about(c->name));
  if (lh_env_config_format(c, text, sizeof text) == LH_ERR_OK)
    printf("settings: %s\n", lh_escape(text, strlen(text), esc, sizeof esc));
  const lh_env_key *k;
  for (size_t i = 0; (k = lh_env_key_at(c->name, i)); i++) {
    if (lh_env_config_value(c, k->key, text, sizeof text) != LH_ERR_OK) text[0] = '\0';
    bool req = !strcmp(k->def, "required");
    printf("  %-13s %-12s %s%s%s\n", k->key,
           text[0] ? lh_escape(text, strlen(text), esc, sizeof esc) : "(not given)", k->range,
           req ? ", required" : ", default ", req ? "" : k->def);
  }
  /* size 0: unbounded, except for jsonl, whose split is then empty */
  uint64_t size = lh_env_size(env, (lh_split)split), shown = (uint64_t)count;
  bool finite = !strcmp(c->name, "jsonl");
  if (finite && size == 0)
    printf("%s split: no tasks\n", splits[split]);
  else if (size == 0)
    printf("%s split: unbounded (every index is a task)\n", splits[split]);
  else
    printf("%s split: %llu task%s (index i is task i mod %llu)\n", splits[split],
           (unsigned long long)size, size == 1 ? "" : "s", (unsigned long long)size);
  if (finite && shown > size) shown = size; /* the rest would repeat them */
  rc = LH__EXIT_OK;
  for (uint64_t i = 0; i < shown; i++) {
    lh_env_task t;
    if (lh_env_task_get(env, (lh_split)split, i, &t)) {
      fflush(stdout);
      rc = lh__cli_fail(SHOW_CMD);
      break;
    }
    printf("task %llu%s%s%s\n", (unsigned long long)i, t.level[0] ? " (level \"" : "", t.level,
           t.level[0] ? "\")" : "");
    print_text("prompt:", t.prompt);
    print_text("answer:", t.answer);
    if (t.solution) print_text("solution:", t.solution);
    lh_env_task_clear(&t);
  }
  lh_env_free(env);
  if (rc != LH__EXIT_OK) return rc;
  return lh__cli_flush_stdout(SHOW_CMD);
}

static void usage(FILE *out) {
  fprintf(out, "usage: longhaul env SUBCOMMAND ...\n\n"
               "Environments, before a run.\n\nsubcommands:\n"
               "  show SPEC    an environment's prompt format, settings and first tasks\n"
               "               (longhaul env show --help)\n");
}

int lh__cmd_env(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return LH__EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return LH__EXIT_OK;
  }
  if (!strcmp(argv[1], "show")) return env_show(argc - 1, argv + 1);
  return lh__cli_error("env", LH__EXIT_USAGE,
                       "unknown subcommand \"%s\" (expected show; see longhaul env --help)",
                       argv[1]);
}
