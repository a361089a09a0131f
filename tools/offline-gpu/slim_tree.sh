#!/usr/bin/env bash
# The working tree a device call carries is every tracked and untracked (not ignored) file: the
# committed results alone count about 52 of its 64 MiB (3,190 records, figures, tables). Before a
# series of calls, `slim_tree.sh aside GRID...` moves out of the tree what those calls do not read:
# every results folder's figures, tables, notes and logs (not its device/ and comm/, which the
# cells read), every grid's records but GRID's, and the built wheels kept
# in tools/offline-gpu/built/ (carry_wheels.sh puts those into .whl/ instead); into .devtree/
# (ignored, so it does not travel). `slim_tree.sh back` puts everything back (run it before you
# commit: git would see the moved files as deleted).
#   tools/offline-gpu/slim_tree.sh aside h200_paired     # then the calls, take_call_results.sh
#   tools/offline-gpu/slim_tree.sh back
set -eu
aside=.devtree
mib() { awk '{s += 512 + int(($1 + 511) / 512) * 512} END {printf "%.1f", s / 1048576}'; }
tree_mib() { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2> /dev/null | mib; }
case "${1:-}" in
  aside)
    shift
    [ ! -e "$aside" ] || { echo "$aside/ exists: run '$0 back' first" >&2; exit 1; }
    keep=" $* "
    mkdir -p "$aside"
    move() { [ -e "$1" ] && mkdir -p "$aside/$(dirname "$1")" && mv "$1" "$aside/$1"; return 0; }
    # everything of every results folder but the named grids' records and point files (a call's
    # grids read only their own; .paired_calls/ travels with `carry`), and the built wheels
    move tools/offline-gpu/built
    for d in results/*/; do
      for e in "$d"*; do
        case $(basename "$e") in
          cells | points)
            for g in "$e"/*; do
              case "$keep" in *" $(basename "$g") "*) ;; *) move "$g" ;; esac
            done ;;
          device | comm) ;;  # the measured ceiling and network the cells' rules read
          *) move "$e" ;;
        esac
      done
    done
    echo "moved aside into $aside/; the tree a call carries: $(tree_mib) MiB of 64"
    echo "until '$0 back', git sees those files as deleted: commit only named paths, never 'git commit -a'"
    ;;
  back)
    [ -d "$aside" ] || { echo "nothing aside ($aside/ does not exist)"; exit 0; }
    cp -a "$aside"/. . && rm -rf "$aside"
    echo "put back; the tree: $(tree_mib) MiB"
    ;;
  *)
    echo "usage: $0 aside GRID... | back" >&2; exit 2 ;;
esac
