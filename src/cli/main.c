/* `longhaul`: the single executable. Dispatches to one subcommand per file (cmd_*.c); with no
 * arguments or --help it lists the commands, with --version it prints the version. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command commands[] = {
    {"init-model", lh__cmd_init_model,
     "create a randomly initialised Qwen2/Qwen3/Llama model directory (Hugging Face layout)"},
    {"score", lh__cmd_score, "print the log-probability of every token of JSON token-id lines"},
    {"sft", lh__cmd_sft, "supervised training on an environment's reference solutions"},
    {"rl", lh__cmd_rl, "reinforcement learning with verifiable rewards (single process)"},
    {"generate", lh__cmd_generate, "sample completions of a prompt with the rollout engine"},
    {"eval", lh__cmd_eval, "pass@1, pass@k and mean reward on an environment, with intervals"},
    {"bench", lh__cmd_bench, "measure throughput (bench train, bench generate)"},
    {"tokenize", lh__cmd_tokenize, "encode text to token ids, or decode ids (tokenizer.json)"},
    {"env", lh__cmd_env, "show an environment's prompt format, settings and tasks (env show SPEC)"},
    {"patch", lh__cmd_patch, "lossless bf16 policy patches (patch make, apply, stats)"},
    {"keygen", lh__cmd_keygen, "make the trainer's Ed25519 key pair for signing policy manifests"},
    {"manifest", lh__cmd_manifest, "sign or verify a policy manifest (manifest sign, verify)"},
    {"snapshot", lh__cmd_snapshot, "write or check a policy snapshot blob (snapshot make, show)"},
    {"netem", lh__cmd_netem, "a loopback TCP proxy that emulates a WAN link (delay, rate, drops)"},
    {"serve", lh__cmd_serve, "the networked trainer: HTTP API for workers, ledger, training"},
    {"worker", lh__cmd_worker, "a rollout worker: sync the policy, lease, generate, submit"},
    {"report", lh__cmd_report, "one self-contained HTML page of a run's plots (and an eval's)"},
    {"export", lh__cmd_export, "release a model: Hugging Face directory, GGUF, model card"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: longhaul COMMAND [flags]   (longhaul COMMAND --help for its flags)\n\n"
               "RL post-training for language models, in C.\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\n  --version    print the version and exit\n"
               "  -h, --help   show this help and exit\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return LH__EXIT_USAGE;
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
    usage(stdout);
    return LH__EXIT_OK;
  }
  if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
    printf("longhaul %s\n", LH_VERSION);
    return LH__EXIT_OK;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(name, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "longhaul: unknown command \"%s\" (see longhaul --help)\n", name);
  return LH__EXIT_USAGE;
}
