#!/usr/bin/env bash
# Fails (exit 1, naming the files) when a tracked C file differs from what clang-format makes of
# it with the committed .clang-format; `make format` fixes the tree. Run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h')
else
  mapfile -t files < <(find src include tests bench -name '*.[ch]')
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! clang-format --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from clang-format (run 'make format'):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
