#!/usr/bin/env bash
# Issue 33's target and the before/after of a change, emulated on one GPU (benchmarks/cp_emulate.py):
# worlds 2, 4 and 8 at 64K tokens per rank, in order of what matters most, so that what a device
# budget cuts off is the last runs. Each run writes OUT/NAME.txt and OUT/NAME.json; OUT/series.log
# says when each began and ended; OUT/done once all have run.
#   benchmarks/cp_emulate_series.sh OUT [BEFORE]
# BEFORE: a tree of the code before the change (git archive REV workflow config.yaml benchmarks |
# tar x -C BEFORE); its own benchmark runs the ring methods' document cells, which the change touches.
# EMU_OPTS: options added to every run (a CPU dry run: "--device cpu --tokens-per-rank 512").
# EMU_ONLY: the names of the runs to make, the others skipped (e.g. "after_w8_docs after_w8_dense").
# EMU_RESUME=1: this code's runs keep what OUT/NAME.json already holds and run only the rest
# (cp_emulate.py --resume: a later call goes on where a cut-off one stopped), printing after OUT/NAME.txt.
# World 4 over full and causal, and world 8 over documents, take 1 warm-up and 2 timed
# repetitions, world 8 over full and causal 1 and 1 (the defaults, 2 and 5, would cost 20 and 35
# minutes of one GPU at 8 ranks, where one rank's forward over full takes 1.75 s).
set -u
out=$1 before=${2:-}
mkdir -p "$out"
read -ra extra <<< "${EMU_OPTS:-}"
now=$(dirname "$0")/cp_emulate.py
run() {  # run NAME SCRIPT OPTIONS...
  local name=$1 script=$2 rc; shift 2
  if [ -n "${EMU_ONLY:-}" ] && [[ " $EMU_ONLY " != *" $name "* ]]; then return 0; fi
  echo "[$(date +%T)] $name: $*" >> "$out/series.log"
  local resume=()  # resumed: its printout goes after the earlier call's
  [ -n "${EMU_RESUME:-}" ] && [ "$script" = "$now" ] && resume=(--resume) \
    && echo "---- resumed $(date +%T)" >> "$out/$name.txt"
  [ ${#resume[@]} -eq 0 ] && : > "$out/$name.txt"
  python "$script" "$@" "${extra[@]}" "${resume[@]}" --json "$out/$name.json" >> "$out/$name.txt" 2>&1
  rc=$?
  echo "[$(date +%T)] $name exit $rc" >> "$out/series.log"
}
# USP and LoongTrain as the grid has them (h200_cp_emulated): Ulysses degree 2, LoongTrain 2 windows
# (at 4 ranks: Ulysses 2 x a double ring of 2 windows of 1)
three="--method ring_p2p ring_allgather ulysses" usp="--method usp --ulysses-degree 2"
loong="--method loongtrain --ulysses-degree 2 --windows 2" docs="--mask full_document causal_document"
dense="--mask full causal" few="--warmup 1 --reps 2" once="--warmup 1 --reps 1" old=$before/benchmarks/cp_emulate.py
# alone: each rank built and timed alone (synthetic contents), where world 8's lockstep state does not
# fit in one H200's 139 GB: there FA3's backward ran out of memory inside its C++ call, which ended
# the process (exit 139) before --contents auto could fall back (2026-12-04 11:46-11:58 UTC, five runs)
alone="--contents synthetic"
# whole_*: documents kept whole where the balance allows (--split-documents as_needed, cp/layout.py);
# the bare kernel from the after_* run of the same mask and world (the target table shares it)
rings="--method ring_p2p ring_allgather" whole="--split-documents as_needed --no-local"
run whole_w2 "$now" $rings $docs --world 2 $whole --profile --profile-reps 2
run whole_w4 "$now" $rings $docs --world 4 $whole --profile --profile-reps 2
run whole_w4_usp "$now" $usp $docs --world 4 $whole
run whole_w4_loongtrain "$now" $loong $docs --world 4 $whole
run whole_w8 "$now" $rings $docs --world 8 $few $whole $alone --profile --profile-reps 1
run whole_w8_usp "$now" $usp $docs --world 8 $few $whole $alone
run whole_w8_loongtrain "$now" $loong $docs --world 8 $few $whole $alone
run after_w2 "$now" $three $docs full causal --world 2 --profile --profile-reps 2
[ -n "$before" ] && run before_w2 "$old" --method ring_p2p ring_allgather $docs --world 2 --no-local
run after_w4_docs "$now" $three $docs --world 4 --profile --profile-reps 2
run after_w4_docs_usp "$now" $usp $docs --world 4 --no-local
run after_w4_docs_loongtrain "$now" $loong $docs --world 4 --no-local
[ -n "$before" ] && run before_w4_docs "$old" --method ring_p2p ring_allgather $docs --world 4 --no-local
run after_w8_docs "$now" $three $docs --world 8 $few --profile --profile-reps 1
run after_w8_docs_usp "$now" $usp $docs --world 8 $few --no-local $alone
run after_w8_docs_loongtrain "$now" $loong $docs --world 8 $few --no-local $alone
run after_w4_dense "$now" $three $dense --world 4 $few
run after_w4_dense_usp "$now" $usp $dense --world 4 $few --no-local
run after_w4_dense_loongtrain "$now" $loong $dense --world 4 $few --no-local
run after_w8_dense "$now" $three $dense --world 8 $once $alone
run after_w8_dense_usp "$now" $usp $dense --world 8 $once --no-local $alone
run after_w8_dense_loongtrain "$now" $loong $dense --world 8 $once --no-local $alone
# whole2_*: whole_w2 and whole_w4 again after two later changes to the ring-local path (K and V go
# to the kernel uncopied at Ulysses degree 1; Ring AllGather builds its gather index only to gather)
run whole2_w2 "$now" $rings $docs --world 2 $whole --profile --profile-reps 2
run whole2_w4 "$now" $rings $docs --world 4 $whole --profile --profile-reps 2
touch "$out/done"
